"""Start from BERT, hand a model to Hugging Face Transformers, share a checkpoint.

    python convert.py from-hf HF_DIR OUT.pt     # a local BERT folder -> a unigen checkpoint
    python convert.py to-hf CKPT HF_DIR         # a post-LN unigen checkpoint -> a BERT folder
    python convert.py strip CKPT OUT.pt         # weights, settings and vocabulary only

from-hf reads a Hugging Face BERT folder (config.json, model.safetensors or pytorch_model.bin,
vocab.txt; nothing is downloaded) into post-LN blocks, BERT's own layout, which is where UniLM
(2.2: "initialized by BERT-large") and ERNIE-GEN (4.1) start: `train.py --init_from OUT.pt` then
fine-tunes it, or keeps pre-training it, with any objective. What BERT lacks is initialised and
named in one printed line: [P] and [ATTN] rows copied from [MASK]'s (UniLMv2's fine-tuning code
feeds [MASK] itself as the pseudo token; ERNIE-GEN's uses [MASK] where the vocabulary has no
[ATTN]); segments 2-5 copied from BERT's 0, 0, 0, 1 (unilm-v1's loader: L2R, R2L and a seq2seq
source take sentence A's row, a seq2seq target sentence B's); extra positions copied from the first
ones (unilm-v1's loader); a relative position bias of zeros (--rel_pos_buckets: the converted model
computes BERT's function until training moves it); PALM's copy head (--copy_head) and any head the
folder lacks as model.py initialises them.

to-hf writes what `transformers.BertForMaskedLM.from_pretrained` loads (config.json, vocab.txt,
tokenizer_config.json, model.safetensors), the next-sentence head included as BERT's own folders
hold it. What BERT cannot hold is refused in one line naming it: pre-LN blocks, the relative
position bias, PALM's copy head.

strip keeps what generate.py, evaluate.py and train.py --init_from read (weights, settings,
vocabulary) and drops the optimizer and the resume state: a third of the size.

Only torch is needed: safetensors files are read and written by `read_safetensors` and
`write_safetensors` (the documented format: an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, the raw little-endian bytes).
Left out: sharded folders (model.safetensors.index.json), TensorFlow checkpoints, RoBERTa and
other architectures; BERT's separate attention-probability dropout (unigen has one dropout).
"""
import argparse
import contextlib
import io
import json
import struct
import sys
from pathlib import Path

import torch

import model as M
from tokenizer import WordPiece
from utils import (UsageError, atomic_write, exit_with_error, one_line_warnings, read_checkpoint,
                   read_lines, save_checkpoint)

PROG = "convert.py"

# --- safetensors, read and written with torch alone -----------------------------------------------
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """A .safetensors file -> {name: tensor}. Layout: u64 n (little-endian), n bytes of JSON
    {name: {"dtype", "shape", "data_offsets": [begin, end]}} (offsets into the bytes after it)."""
    if sys.byteorder != "little":
        raise UsageError(f"{path}: safetensors holds little-endian bytes; this machine is not")
    tensors = {}
    with open(path, "rb") as f:
        try:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        except (struct.error, ValueError, MemoryError, OverflowError):
            raise UsageError(f"{path}: not a safetensors file (no JSON header)") from None
        start = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in SAFETENSORS_DTYPES:
                raise UsageError(f"{path}: tensor {name} has dtype {info['dtype']}, which "
                                 f"convert.py does not read ({', '.join(SAFETENSORS_DTYPES)})")
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            f.seek(start + begin)
            # a buffer of its own: an offset into the file need not be aligned for the dtype
            raw = bytearray(f.read(end - begin))
            if len(raw) != end - begin:
                raise UsageError(f"{path}: truncated (tensor {name} ends past the file's end)")
            flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            tensors[name] = flat.reshape(info["shape"])
    return tensors


def write_safetensors(path, tensors, metadata=None):
    """{name: tensor} -> a .safetensors file (names sorted, data in their order), atomically."""
    names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header = {"__metadata__": metadata or {"format": "pt"}}
    flat = {name: tensors[name].detach().cpu().contiguous().reshape(-1) for name in sorted(tensors)}
    offset = 0
    for name, t in flat.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # the spec's padding: the data starts at a multiple of 8 bytes
    text += b" " * (-len(text) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(text)) + text)
        for t in flat.values():
            f.write(t.view(torch.uint8).numpy().tobytes())
    atomic_write(path, write)


# --- from-hf --------------------------------------------------------------------------------------
# unigen's segment rows BERT lacks, and the BERT row each starts from (unilm-v1's loader): UniLM's
# left-to-right (2) and right-to-left (3) LMs and a seq2seq source (4) take sentence A's row, a
# seq2seq target (5) sentence B's
SEGMENT_FROM = {2: 0, 3: 0, 4: 0, 5: 1}
UNIGEN_SEGMENTS = 6


def read_bert_folder(folder):
    """-> (config.json as a dict, {name: tensor} with one spelling, vocab.txt's path). A folder
    that is not a BERT checkpoint is one UsageError naming what is missing or foreign."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder (a Hugging Face BERT folder holds config.json, "
                         "model.safetensors or pytorch_model.bin, and vocab.txt)")
    missing = [name for name in ("config.json", "vocab.txt") if not (folder / name).is_file()]
    weights = [folder / n for n in ("model.safetensors", "pytorch_model.bin")
               if (folder / n).is_file()]
    if not weights:
        missing.append("model.safetensors or pytorch_model.bin")
    if missing:
        raise UsageError(f"{folder}: not a BERT checkpoint folder: no {', no '.join(missing)}")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{folder / 'config.json'}: not JSON ({e})") from None
    check_bert_config(config, folder / "config.json")
    if weights[0].suffix == ".safetensors":
        raw = read_safetensors(weights[0])
    else:
        try:
            raw = torch.load(weights[0], map_location="cpu", weights_only=True)
        except Exception:
            raise UsageError(f"{weights[0]}: torch.load cannot read it as data (weights only)") \
                from None
    return config, bert_names(raw), folder / "vocab.txt"


def check_bert_config(config, path):
    """BERT's architecture and the choices unigen's blocks make the same way, or one UsageError."""
    kind = config.get("model_type")
    architectures = config.get("architectures") or []
    bert = kind == "bert" or (kind is None and architectures
                              and all(a.startswith("Bert") for a in architectures))
    if not bert:
        raise UsageError(f"{path}: unknown architecture (model_type {kind!r}, architectures "
                         f"{architectures}); convert.py reads BERT (model_type 'bert')")
    if config.get("hidden_act", "gelu") != "gelu":
        raise UsageError(f"{path}: hidden_act {config['hidden_act']!r}; unigen's blocks use "
                         "BERT's GELU (erf, 'gelu')")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise UsageError(f"{path}: position_embedding_type {config['position_embedding_type']!r}; "
                         "unigen reads absolute position embeddings")


def bert_names(raw):
    """HF BERT tensor names in one spelling: no 'bert.' prefix, LayerNorm's weight and bias (older
    files say gamma and beta)."""
    out = {}
    for name, tensor in raw.items():
        name = name.removeprefix("bert.")
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight")
        out[name.replace("LayerNorm.beta", "LayerNorm.bias")] = tensor
    return out


def hf_to_unigen(n_layer):
    """unigen's tensor name -> BERT's, for the tensors that copy over as they are (the fused
    q/k/v, the tables that widen and the heads are done by `from_hf`)."""
    names = {"emb_ln.weight": "embeddings.LayerNorm.weight",
             "emb_ln.bias": "embeddings.LayerNorm.bias"}
    for i in range(n_layer):
        ours, theirs = f"blocks.{i}.", f"encoder.layer.{i}."
        for end in ("weight", "bias"):
            names[ours + f"attn.proj.{end}"] = theirs + f"attention.output.dense.{end}"
            names[ours + f"ln1.{end}"] = theirs + f"attention.output.LayerNorm.{end}"
            names[ours + f"ffn.0.{end}"] = theirs + f"intermediate.dense.{end}"
            names[ours + f"ffn.2.{end}"] = theirs + f"output.dense.{end}"
            names[ours + f"ln2.{end}"] = theirs + f"output.LayerNorm.{end}"
    return names


# the heads BERT's folders may hold: unigen's names -> BERT's
MLM_HEAD = {"lm_transform.0.weight": "cls.predictions.transform.dense.weight",
            "lm_transform.0.bias": "cls.predictions.transform.dense.bias",
            "lm_transform.2.weight": "cls.predictions.transform.LayerNorm.weight",
            "lm_transform.2.bias": "cls.predictions.transform.LayerNorm.bias",
            "lm_bias": "cls.predictions.bias"}
NSP_HEAD = {"nsp_head.0.weight": "pooler.dense.weight", "nsp_head.0.bias": "pooler.dense.bias",
            "nsp_head.2.weight": "cls.seq_relationship.weight",
            "nsp_head.2.bias": "cls.seq_relationship.bias"}


def bert_model_config(config, n_vocab, max_position=0, rel_pos_buckets=0, copy_head=False):
    """config.json -> unigen's ModelConfig: post-LN, six segments, BERT's shapes and epsilon."""
    try:
        return M.ModelConfig(
            vocab_size=n_vocab, n_layer=config["num_hidden_layers"],
            n_head=config["num_attention_heads"], n_embd=config["hidden_size"],
            ffn_dim=config["intermediate_size"],
            max_position=max_position or config["max_position_embeddings"],
            n_segment=max(UNIGEN_SEGMENTS, config.get("type_vocab_size", 2)),
            dropout=config.get("hidden_dropout_prob", 0.1), rel_pos_buckets=rel_pos_buckets,
            copy_head=copy_head, layer_norm_eps=config.get("layer_norm_eps", 1e-12), post_ln=True)
    except KeyError as e:
        raise UsageError(f"config.json has no {e.args[0]!r}: not a BERT config") from None
    except ValueError as e:
        raise UsageError(f"config.json: {e}") from None


def from_hf(folder, max_position=0, rel_pos_buckets=0, copy_head=False):
    """A BERT folder -> (a unigen checkpoint dict, the new parts initialised: a list of phrases)."""
    config, bert, vocab_path = read_bert_folder(folder)
    emb = bert.get("embeddings.word_embeddings.weight")
    if emb is None:
        raise UsageError(f"{folder}: no embeddings.word_embeddings.weight: not a BERT checkpoint")
    bert_tokens = read_lines(vocab_path)
    n_tokens = len(bert_tokens)
    if n_tokens != emb.size(0) or config.get("vocab_size", n_tokens) != emb.size(0):
        raise UsageError(f"{vocab_path}: {n_tokens} tokens, config.json's vocab_size "
                         f"{config.get('vocab_size')}, but the word embedding has {emb.size(0)} "
                         "rows: they must agree")
    lowercase = read_lowercase(Path(folder))
    try:
        # its note on stderr ([P] -> [unused0] ...) is what the printed line says too
        with contextlib.redirect_stderr(io.StringIO()):
            tok = WordPiece.from_file(vocab_path, lowercase=lowercase)
    except ValueError as e:
        raise UsageError(str(e)) from None
    cfg = bert_model_config(config, len(tok), max_position, rel_pos_buckets, copy_head)
    # the parts initialised here, the same every time (the caller's random state untouched)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        state = M.Transformer(cfg).state_dict()
    try:
        new = copy_weights(state, bert, tok, bert_tokens, cfg, folder)
    except RuntimeError as e:                       # a tensor of another shape than config.json's
        why = str(e).split("\n")[0]
        raise UsageError(f"{folder}: the weights do not fit config.json ({why})") from None
    check_tied(bert, emb, folder)
    preset = next((name for name, shape in M.PRESETS.items()
                   if all(getattr(cfg, k) == v for k, v in shape.items() if k != "dropout")), "")
    ckpt = dict(model=state, model_config=cfg.to_dict(), vocab=tok.vocab, lowercase=lowercase,
                objective="bert", objective_options={}, task="pretrain",
                train_config={"preset": preset}, converted_from=str(folder))
    return ckpt, new


def copy_weights(state, bert, tok, bert_tokens, cfg, folder):
    """BERT's tensors into unigen's state dict, in place -> the new parts initialised (phrases)."""
    new = []
    with torch.no_grad():
        for ours, theirs in hf_to_unigen(cfg.n_layer).items():
            state[ours].copy_(need(bert, theirs, folder))
        for i in range(cfg.n_layer):
            # one fused (3d, d) projection: rows [q; k; v], what SelfAttention splits
            layer = f"encoder.layer.{i}.attention.self."
            for end in ("weight", "bias"):
                parts = [need(bert, f"{layer}{p}.{end}", folder) for p in ("query", "key", "value")]
                state[f"blocks.{i}.attn.qkv.{end}"].copy_(torch.cat(parts))
        new += copy_tables(state, bert, tok, folder)
        new += copy_head_if_there(state, bert, MLM_HEAD, "the MLM head", folder)
        new += copy_head_if_there(state, bert, NSP_HEAD, "the next-sentence head", folder)
        new += widen_token_rows(state, tok, bert_tokens)
        if cfg.rel_pos_buckets:
            state["rel_bias.table.weight"].zero_()
            new.append(f"a relative position bias of {cfg.rel_pos_buckets} buckets (zeros)")
        if cfg.copy_head:
            new.append("PALM's copy head (model.py's initialisation)")
    return new


def need(bert, name, folder):
    if name not in bert:
        raise UsageError(f"{folder}: the weights have no {name}: not a complete BERT checkpoint")
    return bert[name]


def read_lowercase(folder):
    """tokenizer_config.json's do_lower_case where the folder has one, else BERT's (True)."""
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            return bool(json.loads(path.read_text(encoding="utf-8")).get("do_lower_case", True))
        except ValueError:
            raise UsageError(f"{path}: not JSON") from None
    return True


def copy_tables(state, bert, tok, folder):
    """Word, position and segment tables: BERT's rows, and the rows unigen adds (unilm-v1's way)."""
    new = []
    words = need(bert, "embeddings.word_embeddings.weight", folder)
    state["tok_emb.weight"][:words.size(0)] = words
    pos = need(bert, "embeddings.position_embeddings.weight", folder)
    n_pos = state["pos_emb.weight"].size(0)
    # more positions than BERT's: copies of its first ones, again and again (unilm-v1's loader)
    for start in range(0, n_pos, pos.size(0)):
        rows = min(pos.size(0), n_pos - start)
        state["pos_emb.weight"][start:start + rows] = pos[:rows]
    if n_pos > pos.size(0):
        new.append(f"positions {pos.size(0)}-{n_pos - 1} (copies of 0-{pos.size(0) - 1})")
    seg = need(bert, "embeddings.token_type_embeddings.weight", folder)
    table = state["seg_emb.weight"]
    table[:seg.size(0)] = seg
    widened = list(range(seg.size(0), table.size(0)))
    for i in widened:
        table[i] = seg[min(SEGMENT_FROM.get(i, 0), seg.size(0) - 1)]
    if widened:
        sources = ", ".join(str(min(SEGMENT_FROM.get(i, 0), seg.size(0) - 1)) for i in widened)
        new.append(f"segments {widened[0]}-{widened[-1]} (copies of BERT's {sources})")
    return new


def copy_head_if_there(state, bert, names, what, folder):
    """A head the folder holds is copied; one it lacks keeps model.py's initialisation (named)."""
    if not any(theirs in bert for theirs in names.values()):
        return [f"{what} (model.py's initialisation)"]
    for ours, theirs in names.items():
        value = need(bert, theirs, folder)
        state[ours][:value.size(0)] = value
    return []


def widen_token_rows(state, tok, bert_tokens):
    """[P] and [ATTN], where BERT's vocab.txt lacks them, start as [MASK] (its embedding and its
    output bias): in an [unusedN] slot or in a row appended after BERT's (WordPiece.from_file
    decides which)."""
    new = []
    for token in ("[P]", "[ATTN]"):
        if token in bert_tokens:
            continue
        i = tok.token_to_id(token)
        for name in ("tok_emb.weight", "lm_bias"):
            state[name][i] = state[name][tok.mask_id]
        where = "appended" if i >= len(bert_tokens) else f"in place of {bert_tokens[i]}"
        new.append(f"{token} (id {i}, {where}: a copy of [MASK]'s row)")
    return new


def check_tied(bert, emb, folder):
    """unigen's output layer is the word embedding (tied, as BERT's): refuse one that is not."""
    decoder = bert.get("cls.predictions.decoder.weight")
    if decoder is not None and not torch.equal(decoder, emb):
        raise UsageError(f"{folder}: cls.predictions.decoder.weight differs from the word "
                         "embedding; unigen ties its output layer to the embedding, as BERT does")


# --- to-hf ----------------------------------------------------------------------------------------
def to_hf(ckpt, path):
    """A unigen checkpoint dict -> {name: tensor} of BertForMaskedLM (the pooler and next-sentence
    head included) and its config.json, or a UsageError naming what BERT cannot hold."""
    cfg = M.ModelConfig.from_dict(ckpt["model_config"])
    refused = [what for what, present in (("pre-LN blocks (BERT's are post-LN)", not cfg.post_ln),
                                          ("the relative position bias", cfg.rel_pos_buckets),
                                          ("PALM's copy head", cfg.copy_head)) if present]
    if refused:
        raise UsageError(f"{path}: BERT cannot hold {' and '.join(refused)}")
    state = ckpt["model"]
    out = {}
    for ours, theirs in {**hf_to_unigen(cfg.n_layer), **MLM_HEAD, **NSP_HEAD}.items():
        out[theirs if theirs.startswith("cls.") else "bert." + theirs] = state[ours]
    for i in range(cfg.n_layer):
        layer = f"bert.encoder.layer.{i}.attention.self."
        for end in ("weight", "bias"):
            # the fused (3d, d) projection's rows [q; k; v]
            qkv = state[f"blocks.{i}.attn.qkv.{end}"].chunk(3)
            for part, rows in zip(("query", "key", "value"), qkv):
                out[f"{layer}{part}.{end}"] = rows
    out["bert.embeddings.word_embeddings.weight"] = state["tok_emb.weight"]
    out["bert.embeddings.position_embeddings.weight"] = state["pos_emb.weight"]
    out["bert.embeddings.token_type_embeddings.weight"] = state["seg_emb.weight"]
    tok = WordPiece(ckpt["vocab"], ckpt.get("lowercase", True))
    config = {"architectures": ["BertForMaskedLM"], "model_type": "bert",
              "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
              "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
              "intermediate_size": cfg.ffn_dim, "hidden_act": "gelu",
              "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
              "max_position_embeddings": cfg.max_position, "type_vocab_size": cfg.n_segment,
              "initializer_range": 0.02, "layer_norm_eps": cfg.layer_norm_eps,
              "pad_token_id": tok.pad_id, "position_embedding_type": "absolute",
              "tie_word_embeddings": True}
    return {k: v.float() if v.is_floating_point() else v for k, v in out.items()}, config


def bert_vocab(vocab):
    """unigen's vocabulary under BERT's names ([SOS] -> [CLS], [EOS] -> [SEP]): what BertTokenizer
    looks for; WordPiece.from_file reads either name."""
    names = {"[SOS]": "[CLS]", "[EOS]": "[SEP]"}
    return "".join(names.get(t, t) + "\n" for t in vocab)


def write_hf(ckpt_path, folder):
    """to-hf: the folder BertForMaskedLM.from_pretrained loads."""
    ckpt = read_checkpoint(ckpt_path)
    tensors, config = to_hf(ckpt, ckpt_path)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder}: is a file, not a folder")
    write_safetensors(folder / "model.safetensors", tensors)
    atomic_write(folder / "config.json", json.dumps(config, indent=2) + "\n")
    atomic_write(folder / "vocab.txt", bert_vocab(ckpt["vocab"]))
    tokenizer = {"do_lower_case": ckpt.get("lowercase", True), "tokenizer_class": "BertTokenizer"}
    atomic_write(folder / "tokenizer_config.json", json.dumps(tokenizer, indent=2) + "\n")
    return config


# --- strip ----------------------------------------------------------------------------------------
# what every reader of a checkpoint needs (generate.py, evaluate.py perplexity, train.py
# --init_from), and where it came from; the optimizer, the data position, the RNG states and the
# loss scaler are a run's to resume, not a model's
SHARED_KEYS = ("model", "model_config", "vocab", "lowercase", "objective", "objective_options",
               "task", "train_config", "step", "best", "converted_from")


def strip(ckpt):
    """A checkpoint dict -> the same without the resume state (new dict; tensors shared)."""
    return {k: ckpt[k] for k in SHARED_KEYS if k in ckpt}


# --- Command line ---------------------------------------------------------------------------------
def megabytes(path):
    return f"{Path(path).stat().st_size / 1e6:.1f} MB"


def cmd_from_hf(args):
    if Path(args.out).is_dir():
        raise UsageError(f"{args.out}: is a folder; give the checkpoint's file name (OUT.pt)")
    ckpt, new = from_hf(args.hf_dir, args.max_position, args.rel_pos_buckets, args.copy_head)
    cfg = M.ModelConfig.from_dict(ckpt["model_config"])
    save_checkpoint(args.out, ckpt)
    print(f"wrote {args.out} ({megabytes(args.out)}): BERT, {cfg.n_layer} layers, {cfg.n_embd} "
          f"wide, post-LN, vocab {cfg.vocab_size}, lowercase {ckpt['lowercase']}; new: "
          f"{'; '.join(new) or 'nothing'}")


def cmd_to_hf(args):
    config = write_hf(args.ckpt, args.hf_dir)
    print(f"wrote {args.hf_dir}: BertForMaskedLM, {config['num_hidden_layers']} layers, "
          f"vocab {config['vocab_size']}, {config['type_vocab_size']} token types")


def cmd_strip(args):
    ckpt = read_checkpoint(args.ckpt)
    dropped = sorted(set(ckpt) - set(SHARED_KEYS))
    save_checkpoint(args.out, strip(ckpt))
    print(f"wrote {args.out}: {megabytes(args.ckpt)} -> {megabytes(args.out)}; dropped "
          f"{', '.join(dropped) or 'nothing'}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("from-hf", help="a local Hugging Face BERT folder -> a checkpoint")
    sub.set_defaults(run=cmd_from_hf)
    sub.add_argument("hf_dir")
    sub.add_argument("out")
    sub.add_argument("--max_position", type=int, default=0,
                     help="positions (0: BERT's); more are copies of BERT's first ones")
    sub.add_argument("--rel_pos_buckets", type=int, default=0,
                     help="add UniLMv2's relative position bias, zeros (0: none)")
    sub.add_argument("--copy_head", action="store_true", help="add PALM's copy head")
    sub = commands.add_parser("to-hf", help="a post-LN checkpoint -> a BertForMaskedLM folder")
    sub.set_defaults(run=cmd_to_hf)
    sub.add_argument("ckpt")
    sub.add_argument("hf_dir")
    sub = commands.add_parser("strip", help="keep weights, settings and vocabulary only")
    sub.set_defaults(run=cmd_strip)
    sub.add_argument("ckpt")
    sub.add_argument("out")
    args = parser.parse_args(argv)
    try:
        if getattr(args, "max_position", 0) < 0 or getattr(args, "rel_pos_buckets", 0) < 0:
            raise UsageError("--max_position and --rel_pos_buckets must be >= 0")
        args.run(args)
    except UsageError as e:                          # DataError included: the user's to fix
        exit_with_error(PROG, e)


if __name__ == "__main__":
    one_line_warnings(PROG)
    main()

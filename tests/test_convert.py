"""convert.py against Hugging Face Transformers (a test oracle, like rouge-score): a tiny random BertForMaskedLM built
here gives the same MLM logits as its conversion; from-hf -> to-hf gives every tensor back; the folder to-hf writes
loads in BertForMaskedLM with the same logits; a converted checkpoint fine-tunes with every objective; strip keeps
what every reader needs; bad input is one line. The safetensors reader and writer are held to the safetensors
package."""
import json
import random
import re

import pytest
import torch

import safetensors.torch as safetensors_torch
import transformers

import convert
import data
import evaluate as E
import generate as G
import model as M
import train
from objectives import OBJECTIVES, masks
from tokenizer import WordPiece

transformers.logging.set_verbosity_error()

# BERT's layout of special tokens: [PAD], [unusedN] slots, [UNK] [CLS] [SEP] [MASK]
BERT_SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_bert(vocab_size, seed=0, type_vocab_size=2):
    """A random BertForMaskedLM whose every weight is far from its default (LayerNorms too: a LayerNorm copied to
    the wrong place must show), in eval mode."""
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                     type_vocab_size=type_vocab_size)
    torch.manual_seed(seed)
    bert = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, p in bert.named_parameters():
            p.normal_(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.2)
    return bert


@pytest.fixture(scope="module")
def bert_tokens(tok):
    """A BERT-format vocabulary over the session's WordPiece pieces (2000 tokens)."""
    return BERT_SPECIALS + tok.vocab[len(BERT_SPECIALS):]


def write_folder(path, bert, tokens, weights="safetensors"):
    bert.save_pretrained(path)
    (path / "vocab.txt").write_text("".join(t + "\n" for t in tokens))
    if weights == "bin":
        (path / "model.safetensors").unlink()
        torch.save(bert.state_dict(), path / "pytorch_model.bin")
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, bert_tokens):
    bert = tiny_bert(len(bert_tokens))
    return bert, write_folder(tmp_path_factory.mktemp("bert"), bert, bert_tokens)


@pytest.fixture(scope="module")
def converted(bert_dir, tmp_path_factory):
    """convert.py from-hf's checkpoint file, as a user makes it."""
    out = tmp_path_factory.mktemp("converted") / "bert.pt"
    convert.main(["from-hf", str(bert_dir[1]), str(out)])
    return out


def unigen_model(ckpt):
    model = M.Transformer(M.ModelConfig.from_dict(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval()


def random_inputs(vocab_size, lengths=(12, 7), seed=0):
    gen = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.randint(len(BERT_SPECIALS), vocab_size, (len(lengths), L), generator=gen)
    seg = torch.randint(0, 2, (len(lengths), L), generator=gen)
    real = torch.arange(L)[None] < torch.tensor(lengths)[:, None]
    return ids, seg, real


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_mlm_logits_equal_berts_on_the_bidirectional_mask(tmp_path, bert_tokens, weights, capsys):
    bert = tiny_bert(len(bert_tokens), seed=1)
    ckpt, new = convert.from_hf(write_folder(tmp_path, bert, bert_tokens, weights))
    model = unigen_model(ckpt)
    ids, seg, real = random_inputs(len(bert_tokens))
    lengths = real.sum(1).tolist()
    pos = torch.arange(ids.size(1)).expand_as(ids)
    with torch.no_grad():
        want = bert(input_ids=ids, token_type_ids=seg, attention_mask=real.long()).logits
        got = model.lm_logits(model(ids, pos, seg, masks.bidirectional(lengths, ids.size(1))))
    tok = WordPiece(ckpt["vocab"])
    fresh = [tok.pseudo_id, tok.attn_id]                        # [P] and [ATTN]: copies of [MASK]
    kept = [i for i in range(len(bert_tokens)) if i not in fresh]
    error = (got - want)[real][:, kept].abs().max() / want[real].abs().max()
    assert error <= 1e-5, float(error)
    assert torch.equal(got[..., fresh], got[..., [tok.mask_id] * 2])
    # BERT's sentence-A and sentence-B rows, and the four UniLM adds (unilm-v1's loader: 0, 0, 0, 1)
    seg_table = bert.bert.embeddings.token_type_embeddings.weight
    assert torch.equal(model.seg_emb.weight, seg_table[[0, 1, 0, 0, 0, 1]])
    assert any(part.startswith("segments 2-5") for part in new)


def test_a_pretraining_folder_brings_its_next_sentence_head(tmp_path, bert_tokens):
    """BertForPreTraining's folder (BERT's own releases) holds the pooler and the next-sentence classifier: UniLM's
    NSP head (nsp_logits at [SOS]) is BERT's, and nothing but [P], [ATTN] and the segments is new."""
    config = transformers.BertConfig(vocab_size=len(bert_tokens), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(2)
    bert = transformers.BertForPreTraining(config).eval()
    with torch.no_grad():
        for name, p in bert.named_parameters():
            p.normal_(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.2)
    ckpt, new = convert.from_hf(write_folder(tmp_path, bert, bert_tokens))
    assert not any("head" in part for part in new)
    model = unigen_model(ckpt)
    ids, seg, real = random_inputs(len(bert_tokens), (10, 10))
    with torch.no_grad():
        want = bert(input_ids=ids, token_type_ids=seg)
        h = model(ids, torch.arange(10).expand(2, 10), seg, masks.bidirectional([10, 10], 10))
    torch.testing.assert_close(model.nsp_logits(h[:, 0]), want.seq_relationship_logits, rtol=1e-5, atol=1e-5)
    keep = [i for i in range(len(bert_tokens)) if i not in (1, 2)]
    torch.testing.assert_close(model.lm_logits(h)[..., keep], want.prediction_logits[..., keep], rtol=1e-5,
                               atol=1e-5)


def test_the_printed_line_names_every_new_part(bert_dir, converted, capsys):
    capsys.readouterr()
    convert.main(["from-hf", str(bert_dir[1]), str(converted.with_name("wide.pt")), "--max_position", "300",
                  "--rel_pos_buckets", "32", "--copy_head"])
    out = capsys.readouterr().out.strip().split("\n")
    assert len(out) == 1 and out[0].startswith(f"wrote {converted.with_name('wide.pt')}")
    for part in ("[P] (id 1, in place of [unused0]: a copy of [MASK]'s row)",
                 "[ATTN] (id 2, in place of [unused1]: a copy of [MASK]'s row)",
                 "segments 2-5 (copies of BERT's 0, 0, 0, 1)", "positions 128-299 (copies of 0-127)",
                 "the next-sentence head", "a relative position bias of 32 buckets (zeros)", "PALM's copy head"):
        assert part in out[0], part
    ckpt = torch.load(converted.with_name("wide.pt"), weights_only=True)
    pos = ckpt["model"]["pos_emb.weight"]
    assert torch.equal(pos[128:256], pos[:128]) and torch.equal(pos[256:300], pos[:44])
    assert not ckpt["model"]["rel_bias.table.weight"].any()
    # a zero bias adds nothing: the model still computes BERT's function
    model, plain = unigen_model(ckpt), unigen_model(torch.load(converted, weights_only=True))
    ids, seg, real = random_inputs(ckpt["model_config"]["vocab_size"], (9, 9))
    pos_ids = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, pos_ids, seg, masks.bidirectional([9, 9], 9)),
                                   plain(ids, pos_ids, seg, masks.bidirectional([9, 9], 9)))


def test_a_vocabulary_without_unused_slots_gets_appended_rows(tmp_path, bert_tokens):
    tokens = [t for t in bert_tokens if not t.startswith("[unused")]
    ckpt, new = convert.from_hf(write_folder(tmp_path, tiny_bert(len(tokens)), tokens))
    tok = WordPiece(ckpt["vocab"])
    assert ckpt["model_config"]["vocab_size"] == len(tokens) + 2 == len(tok)
    assert (tok.pseudo_id, tok.attn_id) == (len(tokens), len(tokens) + 1)
    emb = ckpt["model"]["tok_emb.weight"]
    assert torch.equal(emb[-2:], emb[[tok.mask_id] * 2])
    assert f"[P] (id {len(tokens)}, appended: a copy of [MASK]'s row)" in new


def hf_state(bert):
    """BertForMaskedLM's own tensors (the decoder is the tied word embedding)."""
    return {k: v for k, v in bert.state_dict().items() if not k.startswith("cls.predictions.decoder")}


def test_round_trips_give_back_every_tensor(bert_dir, converted, tmp_path):
    bert, _ = bert_dir
    ckpt = torch.load(converted, weights_only=True)
    folder = tmp_path / "hf"
    convert.main(["to-hf", str(converted), str(folder)])
    back = safetensors_torch.load_file(folder / "model.safetensors")
    tok = WordPiece(ckpt["vocab"])
    fresh = [tok.pseudo_id, tok.attn_id]
    # from-hf -> to-hf: BERT's every tensor, exactly, on BERT's rows; the rows the conversion initialised are
    # the ones its line names ([P], [ATTN]: [MASK]'s; segments 2-5: rows 0, 0, 0, 1)
    for name, want in hf_state(bert).items():
        got = back[name][tuple(slice(0, n) for n in want.shape)]
        if name in ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias"):
            assert torch.equal(got[fresh], got[[tok.mask_id] * 2]), name
            keep = [i for i in range(want.size(0)) if i not in fresh]
            got, want = got[keep], want[keep]
        assert torch.equal(got, want), name
    assert torch.equal(back["bert.embeddings.token_type_embeddings.weight"][2:], back[
        "bert.embeddings.token_type_embeddings.weight"][[0, 0, 0, 1]])
    # unigen -> to-hf -> from-hf: every tensor of the checkpoint, exactly, and nothing new
    again, new = convert.from_hf(folder)
    assert new == [] and again["vocab"] == ckpt["vocab"] and again["model_config"] == ckpt["model_config"]
    assert again["model"].keys() == ckpt["model"].keys()
    assert all(torch.equal(again["model"][k], ckpt["model"][k]) for k in ckpt["model"])


def test_to_hf_folder_loads_in_transformers_with_the_same_logits(converted, tmp_path):
    """BertForMaskedLM.from_pretrained reads the folder; on every one of UniLM's six segments its logits are
    unigen's; BertTokenizer reads its vocab.txt to the same ids."""
    folder = tmp_path / "hf"
    convert.main(["to-hf", str(converted), str(folder)])
    bert = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    model = unigen_model(torch.load(converted, weights_only=True))
    ids, _, real = random_inputs(model.config.vocab_size, (10, 10))
    seg = torch.arange(10).expand(2, 10) % 6
    pos = torch.arange(10).expand(2, 10)
    with torch.no_grad():
        want = model.lm_logits(model(ids, pos, seg, masks.bidirectional([10, 10], 10)))
        got = bert(input_ids=ids, token_type_ids=seg).logits
    assert (got - want).abs().max() / want.abs().max() <= 1e-5
    ours = WordPiece.from_file(folder / "vocab.txt")
    theirs = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    text = "Return the list of items, sorted by their keys."
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text)


def one_line_error(capsys, argv, words):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        convert.main(argv)
    err = capsys.readouterr().err.strip().split("\n")
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("convert.py: error: "), err
    assert re.search(words, err[0]), err[0]


@pytest.mark.parametrize("what,words", [("pre-LN", "pre-LN blocks"), ("bias", "the relative position bias"),
                                        ("copy", "PALM's copy head")])
def test_to_hf_refuses_what_bert_cannot_hold(converted, tmp_path, capsys, what, words):
    ckpt = torch.load(converted, weights_only=True)
    if what == "pre-LN":
        model = M.Transformer(M.ModelConfig.from_dict({**ckpt["model_config"], "post_ln": False}))
        ckpt.update(model=model.state_dict(), model_config=model.config.to_dict())
    else:
        ckpt, _ = convert.from_hf(ckpt["converted_from"], rel_pos_buckets=32 if what == "bias" else 0,
                                  copy_head=what == "copy")
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    one_line_error(capsys, ["to-hf", str(path), str(tmp_path / "hf")], f"BERT cannot hold {re.escape(words)}")
    assert not (tmp_path / "hf").exists()


def test_bad_folders_are_one_line(bert_dir, tmp_path, capsys, bert_tokens):
    _, good = bert_dir
    out = str(tmp_path / "out.pt")
    one_line_error(capsys, ["from-hf", str(tmp_path / "nope"), out], "no such folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(capsys, ["from-hf", str(empty), out],
                   "not a BERT checkpoint folder: no config.json, no vocab.txt, no model.safetensors")

    def variant(name, config=None, tokens=bert_tokens):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
        cfg = json.loads((good / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
        (folder / "vocab.txt").write_text("".join(t + "\n" for t in tokens))
        return str(folder)

    one_line_error(capsys, ["from-hf", variant("roberta", {"model_type": "roberta",
                                                           "architectures": ["RobertaForMaskedLM"]}), out],
                   r"unknown architecture \(model_type 'roberta'")
    one_line_error(capsys, ["from-hf", variant("short", tokens=bert_tokens[:-1]), out],
                   "1999 tokens, config.json's vocab_size 2000, but the word embedding has 2000 rows")
    one_line_error(capsys, ["from-hf", variant("relu", {"hidden_act": "relu"}), out], "hidden_act 'relu'")
    one_line_error(capsys, ["from-hf", variant("wide", {"hidden_size": 64}), out],
                   "the weights do not fit config.json")
    broken = variant("broken")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"\x01\x00")
    one_line_error(capsys, ["from-hf", broken, out], "not a safetensors file")
    one_line_error(capsys, ["to-hf", str(tmp_path / "nope.pt"), str(tmp_path / "hf")], "checkpoint not found")


def test_safetensors_reader_and_writer_agree_with_the_package(tmp_path):
    tensors = {"f32": torch.randn(3, 5), "bf16": torch.randn(7).bfloat16(), "f16": torch.randn(2, 3).half(),
               "i64": torch.arange(5), "flag": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5),
               "empty": torch.zeros(0, 4)}
    safetensors_torch.save_file(tensors, tmp_path / "theirs.safetensors")
    ours = convert.read_safetensors(tmp_path / "theirs.safetensors")
    convert.write_safetensors(tmp_path / "ours.safetensors", tensors)
    theirs = safetensors_torch.load_file(tmp_path / "ours.safetensors")
    for got in (ours, theirs):
        assert got.keys() == tensors.keys()
        for k, t in tensors.items():
            assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k


# --- a converted checkpoint fine-tunes, and keeps pre-training, with every objective ---------------------------------
@pytest.fixture(scope="module")
def task_files(tmp_path_factory, cache_dir):
    """A small seq2seq task (train and valid jsonl) and a small corpus, from the embedded data."""
    folder = tmp_path_factory.mktemp("task")
    pairs = data.default_seq2seq(cache_dir)
    for split, n in (("train", 40), ("valid", 6)):
        rows = [json.dumps({"src": s[:400], "tgt": t}) for s, t in pairs[split][:n]]
        (folder / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    docs = data.default_documents(cache_dir)
    (folder / "corpus.txt").write_text("\n\n".join(d.text[:1500] for d in random.Random(0).sample(docs, 30)))
    return folder


def fine_tune(converted, task_files, out, objective, task, *flags):
    data_flag = task_files / ("train.jsonl" if task == "seq2seq" else "corpus.txt")
    train.main(["--init_from", str(converted), "--objective", objective, "--task", task, "--data", str(data_flag),
                "--out_dir", str(out), "--cache_dir", str(out.parent / "cache"), "--max_steps", "2",
                "--batch_size", "2", "--seq_len", "64", "--eval_interval", "2", "--eval_batches", "1",
                "--log_interval", "1", "--progress", "false", "--lr", "1e-4", *flags])
    return torch.load(out / "ckpt.pt", weights_only=True)


@pytest.mark.parametrize("task", ["seq2seq", "pretrain"])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_a_converted_checkpoint_trains_with_every_objective(converted, task_files, tmp_path, objective, task):
    start = torch.load(converted, weights_only=True)["model"]
    ckpt = fine_tune(converted, task_files, tmp_path / "run", objective, task)
    assert ckpt["step"] == 2 and ckpt["model_config"]["post_ln"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in rows if "loss" in r) and any(r["split"] == "train" for r in rows)
    # the run started from BERT's weights (and moved them)
    moved = [k for k in start if not torch.equal(start[k], ckpt["model"][k])]
    assert "blocks.0.attn.qkv.weight" in moved


def test_strip_keeps_what_every_reader_needs(converted, task_files, tmp_path, capsys):
    ckpt = fine_tune(converted, task_files, tmp_path / "run", "unilm", "seq2seq")
    stripped = tmp_path / "shared.pt"
    capsys.readouterr()
    convert.main(["strip", str(tmp_path / "run" / "ckpt.pt"), str(stripped)])
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {stripped}: ") and all(k in line for k in ("data_state", "optimizer", "rng"))
    small = torch.load(stripped, weights_only=True)
    assert set(small) == {"model", "model_config", "vocab", "lowercase", "objective", "objective_options", "task",
                          "train_config", "step", "best"}
    assert all(torch.equal(small["model"][k], ckpt["model"][k]) for k in ckpt["model"])
    # generate.py, evaluate.py perplexity and train.py --init_from read it
    src = tmp_path / "src.txt"
    src.write_text("return the number of items\ncompute the sum of a list\n")
    G.main(["--ckpt", str(stripped), "--input", str(src), "--output", str(tmp_path / "hyp.txt"), "--beam", "2",
            "--max_len", "6", "--device", "cpu"])
    assert len((tmp_path / "hyp.txt").read_text().split("\n")) == 3
    capsys.readouterr()
    E.main(["perplexity", "--ckpt", str(stripped), "--data", str(task_files / "valid.jsonl"), "--json"])
    assert json.loads(capsys.readouterr().out)["perplexity"] > 1
    again = fine_tune(stripped, task_files, tmp_path / "again", "pmlm", "seq2seq")
    assert again["step"] == 2

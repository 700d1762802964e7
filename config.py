"""train.py's command line (train.main calls it phase by phase): the table of training flags
(TrainConfig), how `--key value` flags are read and checked, how the settings no flag gave are
filled in (the preset's recipe, a resumed run's own, a checkpoint's model shape and vocabulary),
`--help`, and the commands a run prints at its end.

One mechanism for every setting (nanoGPT's): a `--key value` flag for each field of TrainConfig,
of model.ModelConfig and of the chosen objective's options (objectives/__init__.py's `option`).
An unknown key or a value out of range is a UsageError: one line, exit status 2.
Left out: configuration files (a shell script of flags does that job) and nested settings.
"""
import difflib
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import data
import model as M
from model import setting
from objectives import OBJECTIVES, objective_class
from tokenizer import WordPiece
from utils import UsageError, check_at_least, read_checkpoint


@dataclass
class TrainConfig:
    objective: str = setting("pmlm", "unilm | pmlm | ernie_gen | palm | mass")
    task: str = setting("pretrain", "pretrain | seq2seq (fine-tuning on (source, target) pairs)")
    preset: str = setting("tiny", "model size: tiny | small | base | large (model flags win)")
    data: str = setting("", "pretrain: text file/folder; seq2seq: jsonl or parallel files; "
                            "'' = embedded")
    one_document_per_line: bool = setting(False, "pretrain --data: every non-empty line is a "
                                                 "document (else a blank line separates them)")
    init_from: str = setting("", "a checkpoint to fine-tune from: its weights and vocabulary")
    vocab: str = setting("", "a vocab.txt to use instead of training one (a BERT vocab.txt works)")
    out_dir: str = setting("", "where ckpt.pt and metrics.jsonl go; '' = out/<objective>-<task>")
    resume: bool = setting(False, "continue the run in out_dir where it stopped, with its settings")
    overwrite: bool = setting(False, "start afresh in an out_dir holding a checkpoint")
    vocab_size: int = setting(8192, "WordPiece vocabulary size when one is trained")
    seq_len: int = setting(0, "passage/source length; 0 = 128 (tiny pretraining) or max_position")
    batch_size: int = setting(32, "examples per rank and micro-step")
    grad_accum: int = setting(1, "micro-steps per optimizer step")
    max_steps: int = setting(600, "optimizer steps of the whole run (the schedule's length)")
    stop_at: int = setting(0, "stop after this step as if interrupted (checkpoint kept); 0 = never")
    time_limit: float = setting(0.0, "stop at the next log step after this many minutes; 0 = none")
    lr: float = setting(2e-3, "peak learning rate")
    warmup_steps: int = setting(-1, "linear warmup steps; -1 = 5% of max_steps")
    min_lr_frac: float = setting(0.0, "the linear decay ends at lr * min_lr_frac")
    weight_decay: float = setting(0.01, "AdamW weight decay (not on biases, LayerNorms, tables)")
    beta2: float = setting(0.98, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the gradient norm to this; 0 = no clipping")
    label_smoothing: float = setting(-1.0, "-1 = 0.1 fine-tuning (the papers'), 0 pre-training")
    eval_interval: int = setting(200, "evaluate on the held-out split every this many steps")
    eval_batches: int = setting(10, "held-out batches per evaluation")
    eval_decode: int = setting(0, "seq2seq: decode this many held-out sources at each evaluation, "
                                  "score them, keep the best as best.pt; 0 = off")
    eval_metric: str = setting("rouge", "--eval_decode's score: rouge (ROUGE-L F) | bleu (BLEU-4)")
    eval_beam: int = setting(5, "--eval_decode's beam size (1 = greedy)")
    eval_max_len: int = setting(64, "--eval_decode's longest output, in tokens")
    eval_length_penalty: float = setting(1.0, "--eval_decode's GNMT length penalty alpha")
    log_interval: int = setting(10, "log (and check for a stop request) every this many steps")
    ckpt_interval: int = setting(200, "write a checkpoint every this many steps")
    seed: int = setting(1337, "seed of the data order, the masking and dropout")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N")
    dtype: str = setting("auto", "autocast precision: auto (bf16 on cards of compute capability "
                                 ">= 8.0, fp16 with a loss scaler below, fp32 on a CPU) | bf16 | "
                                 "fp16 | fp32")
    compile: str = setting("auto", "compile the blocks (fast.speed_up): auto (CUDA) | true | false")
    # off by default: it slows unilm's loop, which is host-bound (bench/RESULTS.md, packing)
    pack: str = setting("false", "pack several passages into each row, no padding wasted "
                                 "(fast.plan_packing): auto (CUDA) | true | false")
    # off by default: measured in bench/RESULTS.md (training throughput)
    graph: str = setting("false", "replay each step's forward, loss and backward as a CUDA graph "
                                  "(fast.GraphedLoss; bf16 or fp32): auto (CUDA) | true | false")
    workers: int = setting(-1, "batch-building processes (DataLoader); -1 = 2 on CUDA, 0 on a CPU")
    cache_dir: str = setting(".cache", "where the vocabulary and the tokenized data are cached")
    progress: bool = setting(True, "show progress bars (the evaluation lines print either way)")


# a resumed run keeps its settings; these may change without changing what it computes
SAFE_ON_RESUME = {"resume", "out_dir", "stop_at", "time_limit", "log_interval", "eval_interval",
                  "eval_batches", "ckpt_interval", "device", "dtype", "compile", "pack", "graph",
                  "workers", "cache_dir", "progress", "overwrite"}
SAFE_MODEL_ON_RESUME = {"attn_impl"}
PER_INVOCATION = {"resume", "overwrite", "stop_at", "time_limit"}
# the model shapes (and the block layout) a checkpoint fixes
SHAPE_KEYS = ("vocab_size", "n_layer", "n_head", "n_embd", "ffn_dim", "max_position", "n_segment",
              "rel_pos_buckets", "rel_pos_max_distance", "post_ln")
# the sequence budget of the tiny preset's pre-training: a laptop's
TINY_SEQ_LEN = 128
# [SOS] S1 [EOS] S2 [EOS]: seq_len minus these is a passage's budget (data.make_passages)
PASSAGE_SPECIALS = 3
# the tiny preset's recipe, measured on a laptop (bench/RESULTS.md, the laptop recipe), where no
# flag gives one
RECIPES = {"tiny": dict(vocab_size=4096, lr=1e-3, batch_size=16, max_steps=2200)}


# --- Flags -> values ------------------------------------------------------------------------------
def parse_value(text, default, key):
    """Turn a command-line string into the type of the default."""
    if isinstance(default, bool):
        if text is None or text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"--{key} expects true/false, got {text!r}")
    if text is None:
        raise UsageError(f"--{key} needs a value")
    if default is None:
        return text
    try:
        return type(default)(text)
    except ValueError:
        raise UsageError(f"--{key} expects a {type(default).__name__}, got {text!r}") from None


def split_argv(argv):
    """['--a', '1', '--b=2', '--flag'] -> {'a': '1', 'b': '2', 'flag': None}."""
    pairs = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise UsageError(f"expected --key value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            value = argv[i + 1] if has_value else None
            i += has_value
        pairs[key.replace("-", "_")] = value
        i += 1
    return pairs


def model_fields():
    """ModelConfig's settable fields and their defaults (vocab_size comes from the tokenizer)."""
    return {f.name: f.default for f in fields(M.ModelConfig) if f.name != "vocab_size"}


def parse_args(argv):
    """-> (TrainConfig, model flags, objective flags, the keys given); an unknown key: an error."""
    raw = split_argv(argv)
    name = raw.get("objective") or TrainConfig.objective
    if name not in OBJECTIVES:
        raise UsageError(f"--objective {name!r}: choose one of {sorted(OBJECTIVES)}")
    train_defaults = asdict(TrainConfig())
    option_defaults = {k: o.default for k, o in objective_class(name).option_table().items()}
    cfg = {}
    model_flags = {}
    obj_flags = {}
    tables = ((train_defaults, cfg), (model_fields(), model_flags), (option_defaults, obj_flags))
    for key, value in raw.items():
        for defaults, out in tables:
            if key in defaults:
                out[key] = parse_value(value, defaults[key], key)
                break
        else:
            known = [k for defaults, _ in tables for k in defaults]
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.7)
            hint = f"did you mean {' or '.join('--' + k for k in close)}? " if close else ""
            raise UsageError(f"unknown setting --{key}; {hint}(python train.py --objective {name} "
                             "--help lists every setting)")
    return TrainConfig(**cfg), model_flags, obj_flags, set(raw)


def check_settings(cfg):
    """Every value in range, before anything is read or written: one clear error, never a crash.
    A file that is not there is named first (it explains any error that would follow)."""
    for key in ("init_from", "vocab"):
        if getattr(cfg, key) and not os.path.isfile(getattr(cfg, key)):
            raise UsageError(f"--{key} {getattr(cfg, key)}: no such file")
    if cfg.data and cfg.task == "seq2seq":
        try:
            data.seq2seq_sources(cfg.data)
        except UsageError as e:                       # a DataError naming the missing file
            raise UsageError(f"--data {e}") from None
    elif cfg.data and not os.path.exists(cfg.data):
        raise UsageError(f"--data {cfg.data}: no such file or folder")
    check_at_least(cfg, batch_size=1, grad_accum=1, max_steps=1, log_interval=1, eval_interval=1,
                   ckpt_interval=1, stop_at=0, eval_batches=0, seq_len=0, time_limit=0,
                   grad_clip=0, weight_decay=0, eval_decode=0, eval_beam=1, eval_max_len=1)
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise UsageError(f"--lr must be a positive number, got {cfg.lr}")
    if cfg.warmup_steps < -1 or not 0 <= cfg.min_lr_frac <= 1 or not 0 <= cfg.beta2 < 1:
        raise UsageError("need --warmup_steps >= -1, 0 <= --min_lr_frac <= 1 and 0 <= --beta2 < 1")
    if cfg.label_smoothing != -1 and not 0 <= cfg.label_smoothing < 1:
        raise UsageError(f"--label_smoothing must be in [0, 1) (or -1), got {cfg.label_smoothing}")
    if cfg.task not in ("pretrain", "seq2seq"):
        raise UsageError(f"--task {cfg.task!r}: choose pretrain or seq2seq")
    if cfg.preset not in M.PRESETS:
        raise UsageError(f"--preset {cfg.preset!r}: choose one of {sorted(M.PRESETS)}")
    if cfg.vocab_size < 100:
        raise UsageError(f"--vocab_size {cfg.vocab_size} is too small "
                         "(the alphabet alone needs about 100)")
    for key in ("compile", "pack", "graph"):
        if getattr(cfg, key) not in ("auto", "true", "false"):
            raise UsageError(f"--{key} {getattr(cfg, key)!r}: choose auto, true or false")
    if cfg.dtype not in ("auto", *M.DTYPES):
        raise UsageError(f"--dtype {cfg.dtype!r}: choose auto, bf16, fp16 or fp32")
    if cfg.eval_metric not in ("rouge", "bleu"):
        raise UsageError(f"--eval_metric {cfg.eval_metric!r}: choose rouge or bleu")
    if cfg.eval_decode and cfg.task != "seq2seq":
        raise UsageError("--eval_decode decodes held-out sources: it needs --task seq2seq")
    if not math.isfinite(cfg.eval_length_penalty):
        raise UsageError(f"--eval_length_penalty must be a finite number, "
                         f"got {cfg.eval_length_penalty}")
    if cfg.workers < -1:
        raise UsageError(f"--workers must be >= 0 (or -1 = auto), got {cfg.workers}")
    if cfg.resume and cfg.init_from:
        raise UsageError("--resume continues a run; --init_from starts a new one from a "
                         "checkpoint: pick one")


# --- The settings no flag gave --------------------------------------------------------------------
def model_settings(cfg, model_flags, ckpt=None):
    """ModelConfig fields: the preset, the objective's needs, a checkpoint's shapes, the flags."""
    needs = objective_class(cfg.objective).model_defaults
    model_dict = {**M.PRESETS[cfg.preset], **needs}
    if ckpt is not None:
        # the checkpoint fixes the shapes; the objective may still add a head (PALM's copy head)
        model_dict.update(ckpt["model_config"])
        model_dict.update({k: v for k, v in needs.items() if k not in SHAPE_KEYS})
    model_dict.update(model_flags)
    needed = objective_class(cfg.objective).n_segments
    if model_dict.get("n_segment", needed) < needed:
        raise UsageError(f"--n_segment {model_dict['n_segment']}: {cfg.objective} uses {needed} "
                         "segment ids")
    return model_dict


def resolve_defaults(cfg, model_dict, given=(), ckpt=None):
    """The settings whose default depends on the run: the preset's recipe (when fine-tuning, the
    checkpoint's preset), seq_len, label_smoothing; stored resolved, so a resumed run is exact."""
    # a checkpoint of no preset's shape (convert.py from-hf writes preset "") takes no recipe
    preset = (ckpt or {}).get("train_config", {}).get("preset", cfg.preset)
    if not cfg.resume:
        for key, value in RECIPES.get(preset, {}).items():
            if key not in given:
                setattr(cfg, key, value)
    if not cfg.seq_len:
        tiny_pretrain = cfg.task == "pretrain" and cfg.preset == "tiny" and not cfg.init_from
        cfg.seq_len = TINY_SEQ_LEN if tiny_pretrain else model_dict["max_position"]
    if cfg.label_smoothing < 0:
        cfg.label_smoothing = 0.1 if cfg.task == "seq2seq" else 0.0
    if cfg.seq_len > model_dict["max_position"]:
        raise UsageError(f"--seq_len {cfg.seq_len} exceeds the model's max_position "
                         f"{model_dict['max_position']}")
    shortest = PASSAGE_SPECIALS + objective_class(cfg.objective).min_passage
    if cfg.task == "pretrain" and cfg.seq_len < shortest:
        raise UsageError(f"--seq_len {cfg.seq_len} is too small for {cfg.objective}: "
                         f"{PASSAGE_SPECIALS} special tokens and a passage of at least "
                         f"{shortest - PASSAGE_SPECIALS} token(s) need --seq_len >= {shortest}")


def restore_settings(ckpt, cfg, model_flags, obj_flags, given, path):
    """A resumed run keeps its checkpoint's settings; a flag given again may change a safe one."""
    saved = ckpt["train_config"]
    theirs = f"{saved['objective']}/{saved['task']}"
    if {"objective", "task"} & given and f"{cfg.objective}/{cfg.task}" != theirs:
        raise UsageError(f"{path} was a {theirs} run; this one is {cfg.objective}/{cfg.task}")
    diffs = [f"{k}: checkpoint {saved[k]} vs now {getattr(cfg, k)}" for k in sorted(given)
             if k in saved and k not in SAFE_ON_RESUME and getattr(cfg, k) != saved[k]]
    diffs += [f"{k}: checkpoint {ckpt['model_config'][k]} vs now {v}"
              for k, v in model_flags.items()
              if k not in SAFE_MODEL_ON_RESUME and v != ckpt["model_config"][k]]
    diffs += [f"{k}: checkpoint {ckpt['objective_options'].get(k)} vs now {v}"
              for k, v in obj_flags.items() if v != ckpt["objective_options"].get(k)]
    if diffs:
        raise UsageError(f"{path}: a resumed run keeps its settings, and these differ: "
                         f"{'; '.join(diffs)}. Safe to change on --resume: "
                         f"{sorted(SAFE_ON_RESUME | SAFE_MODEL_ON_RESUME)}")
    # safe settings given again win; those steering one invocation (--stop_at) are always this one's
    merged = {**saved, **{k: getattr(cfg, k) for k in SAFE_ON_RESUME
                          if k in given or k in PER_INVOCATION}}
    # (a checkpoint written before a setting existed gets that setting's default)
    return TrainConfig(**merged), dict(ckpt["objective_options"])


# --- A checkpoint's settings: the run to resume, the model to fine-tune ---------------------------
def out_dir_of(cfg):
    return Path(cfg.out_dir or f"out/{cfg.objective}-{cfg.task}")


def start_point(cfg, model_flags, obj_flags, given, world=1):
    """-> (checkpoint or None, settings, objective options): a fresh, resumed or fine-tuning run."""
    out_dir = out_dir_of(cfg)
    if cfg.resume:
        path = out_dir / "ckpt.pt"
        if not path.exists():
            raise UsageError(f"--resume: no checkpoint {path} to continue (is --out_dir right?)")
        ckpt = read_checkpoint(path)
        if "optimizer" not in ckpt or "data_state" not in ckpt:
            raise UsageError(f"{path} holds no resume state (a checkpoint for sharing: convert.py "
                             "strip); start a new run from its weights with --init_from")
        cfg, obj_opts = restore_settings(ckpt, cfg, model_flags, obj_flags, given, path)
        # data_state: one entry a process of the run so far
        cfg.grad_accum = shards_per_process(cfg, len(ckpt["data_state"]), world)
        return ckpt, cfg, obj_opts
    if (out_dir / "ckpt.pt").exists() and not cfg.overwrite:
        raise UsageError(f"{out_dir} holds the checkpoint of an earlier run: continue it with "
                         "--resume, start afresh there with --overwrite, or pick another --out_dir")
    ckpt = read_checkpoint(cfg.init_from) if cfg.init_from else None
    theirs = ckpt.get("train_config", {}).get("preset") if ckpt else None
    if ckpt and "preset" in given and cfg.preset != theirs:
        raise UsageError(f"--preset {cfg.preset} with --init_from: the checkpoint fixes the "
                         f"model's shape (it is a {theirs} model); drop --preset")
    # its vocabulary's size, or the --vocab_size it was trained with (a small corpus gives fewer)
    its_sizes = (len(ckpt["vocab"]), ckpt.get("train_config", {}).get("vocab_size")) if ckpt else ()
    if ckpt and "vocab_size" in given and cfg.vocab_size not in its_sizes:
        raise UsageError(f"--vocab_size {cfg.vocab_size} with --init_from: the checkpoint's "
                         f"vocabulary has {len(ckpt['vocab'])} tokens and fine-tuning keeps it; "
                         "drop --vocab_size")
    return ckpt, cfg, dict(obj_flags)


def shards_per_process(cfg, trained_on, world):
    """A run resumed on `world` processes, having run on `trained_on`, keeps every step's
    grad_accum * trained_on shards of --batch_size examples (data.StepBatches), now an equal share
    of them a process: -> its new grad_accum. A UsageError where `world` does not divide them."""
    shards = cfg.grad_accum * trained_on
    if shards % world:
        fits = " or ".join(str(w) for w in range(1, shards + 1) if shards % w == 0)
        raise UsageError(f"each step of this run is {shards} batch(es) of --batch_size "
                         f"{cfg.batch_size} (--grad_accum {cfg.grad_accum} on {trained_on} "
                         f"process(es)), which {world} processes cannot share equally: resume it "
                         f"on {fits} process(es)")
    return shards // world


def starting_tokenizer(cfg, ckpt):
    """The checkpoint's vocabulary, or --vocab's, or None (data.py trains one)."""
    if cfg.vocab:
        try:
            return WordPiece.from_file(cfg.vocab)
        except (OSError, ValueError) as e:
            raise UsageError(f"--vocab: {e}") from None
    return None if ckpt is None else WordPiece(ckpt["vocab"], ckpt.get("lowercase", True))


def check_compatible(ckpt, model_cfg, tok, path):
    """Refuse a checkpoint whose vocabulary or model shape differs, naming the difference."""
    if ckpt["vocab"] != tok.vocab:
        diff = next((i for i, (a, b) in enumerate(zip(ckpt["vocab"], tok.vocab)) if a != b), None)
        where = (f", first at id {diff}: {ckpt['vocab'][diff]!r} vs {tok.vocab[diff]!r}"
                 if diff is not None else "")
        raise UsageError(f"{path}: its vocabulary ({len(ckpt['vocab'])} tokens) differs from "
                         f"this run's ({len(tok.vocab)} tokens){where}")
    # a checkpoint written before a setting existed has that setting's default (post_ln: pre-LN)
    theirs = {**model_fields(), **ckpt["model_config"]}
    ours = model_cfg.to_dict()
    diffs = [f"{k}: checkpoint {theirs.get(k)} vs now {ours[k]}" for k in SHAPE_KEYS
             if theirs.get(k) != ours[k]]
    if diffs:
        raise UsageError(f"{path} does not fit this model: " + "; ".join(diffs))


# --- The commands a run prints at its end ---------------------------------------------------------
def resume_command(cfg, world):
    launcher = f"torchrun --nproc_per_node {world} train.py" if world > 1 else "python train.py"
    return f"{launcher} --resume --out_dir {out_dir_of(cfg)}"


def next_command(cfg):
    """What to try after a run: fine-tune a pre-trained model, or generate with a fine-tuned one on
    the held-out sources of the data it was fine-tuned on (best.pt where --eval_decode kept one)."""
    ckpt = out_dir_of(cfg) / "ckpt.pt"
    if cfg.task == "seq2seq" and (out_dir_of(cfg) / "best.pt").exists():
        ckpt = out_dir_of(cfg) / "best.pt"
    if cfg.task == "pretrain":
        return (f"python train.py --objective {cfg.objective} --task seq2seq "
                f"--init_from {ckpt} --max_steps 1000")
    if not cfg.data:
        return ("python data.py export --out docsum && "
                f"python generate.py --ckpt {ckpt} --input docsum/test.src "
                "--output docsum/test.hyp --beam 5 --min_len 6 --max_len 32")
    sources = data.seq2seq_sources(cfg.data)
    split = next(s for s in ("test", "valid", "train") if s in sources)
    return (f"python generate.py --ckpt {ckpt} --input {sources[split]} "
            f"--output {out_dir_of(cfg) / (split + '.hyp')} --beam 5")


# --- --help ---------------------------------------------------------------------------------------
def help_text(argv, intro=""):
    """Every setting, the value THIS run would use (recipe, model shape, objective's needs, flags)
    and its one-line description: python train.py [--objective X] [any flag] --help."""
    cfg, model_flags, obj_flags, given = parse_args(argv)
    check_settings(cfg)
    model_dict = model_settings(cfg, model_flags)
    resolve_defaults(cfg, model_dict, given)
    obj_class = objective_class(cfg.objective)
    row = lambda key, value, text: f"  --{key:<23} {value!r:<11} {text}"
    lines = [intro, "", f"training (the values of this run: --preset {cfg.preset}'s recipe "
                        "where no flag is given):"]
    lines += [row(f.name, getattr(cfg, f.name), f.metadata["help"]) for f in fields(TrainConfig)]
    lines += ["", (f"model (model.ModelConfig: --preset {cfg.preset}, what {cfg.objective} needs, "
                   "the flags; a checkpoint fixes the shapes):")]
    lines += [row(f.name, model_dict.get(f.name, f.default), f.metadata["help"])
              for f in fields(M.ModelConfig) if f.name != "vocab_size"]
    lines += ["", (f"objective {cfg.objective!r} ({obj_class.__module__.replace('.', '/')}.py; "
                   "--objective NAME --help for another):")]
    lines += [row(key, obj_flags.get(key, opt.default), opt.help)
              for key, opt in obj_class.option_table().items()]
    return "\n".join(lines)

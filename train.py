"""Pre-train or fine-tune the one backbone with any of the four papers' objectives.

    python train.py --objective pmlm    # the main job: tiny model, embedded corpus, a laptop CPU
    python train.py --help              # every setting, with what it does
    torchrun --nproc_per_node 2 train.py --objective pmlm --out_dir out/pmlm-ddp  # the same on 2 processes
    python train.py --task seq2seq --init_from out/pmlm-pretrain/ckpt.pt          # fine-tune on the docsum task
    python train.py --resume --out_dir out/pmlm-pretrain                          # continue a run exactly

Every setting is a `--key value` flag (nanoGPT style, one mechanism): the training settings in
TrainConfig below, any model.ModelConfig field (`--n_layer 4 --attn_impl naive`), and the chosen
objective's options (declared in its class, e.g. objectives/pmlm.py). An unknown key, or a value
out of range, is a one-line error (exit status 2).

The run, in the order this file reads:
  1. settings       flags -> TrainConfig, model fields, objective options; all checked before
                    anything runs
  2. distributed    under torchrun (RANK in the environment): DDP, NCCL on GPUs, gloo on CPUs
  3. start point    fresh, --resume (every setting restored from the checkpoint) or --init_from
                    (fine-tuning)
  4. data           vocabulary and tokenized corpus, built on first use and cached (data.py);
                    this rank's shard
  5. model          preset + what the objective needs + the flags (or the checkpoint's shapes)
  6. optimizer      AdamW, linear warmup then linear decay, gradient accumulation and clipping,
                    bf16 on CUDA
  7. the loop       batches -> loss -> backward -> step; log (tqdm + metrics.jsonl), evaluate,
                    checkpoint
  8. the end        Ctrl-C / SIGTERM, --stop_at, --time_limit or max_steps: a checkpoint, and
                    what to run next
Checkpoints are written atomically and hold only tensors and plain values (utils.save_checkpoint);
a run never overwrites a finished run's checkpoint unless told to (--resume continues it,
--overwrite replaces it).
Under DDP each rank reads its own shard of every epoch, gradients are synced on the last
micro-step only, and only rank 0 logs and writes.

Left out: multi-node launching (torchrun's own --nnodes does it), FSDP/tensor parallelism,
fp16 loss scaling.
"""
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

import data
import fast
import model as M
from model import setting
from objectives import OBJECTIVES, get_objective, objective_class
from tokenizer import WordPiece
from utils import (UsageError, exit_with_error, pick_device, read_checkpoint, save_checkpoint,
                   atomic_write)

# --------------------------------------------------------------------------------------------------
# 1. Settings


@dataclass
class TrainConfig:
    objective: str = setting("pmlm", "unilm | pmlm | ernie_gen | palm")
    task: str = setting("pretrain", "pretrain | seq2seq (fine-tuning on (source, target) pairs)")
    preset: str = setting("tiny",
                          "model size: tiny | small | base | large; model flags override it")
    data: str = setting("", "pretrain: text file/folder; seq2seq: jsonl or parallel files; "
                            "'' = embedded")
    init_from: str = setting("", "a checkpoint to start from (fine-tuning): its weights and "
                                 "vocabulary")
    vocab: str = setting("", "a vocab.txt to use instead of training one (a BERT vocab.txt works)")
    out_dir: str = setting("", "where ckpt.pt and metrics.jsonl go; '' = out/<objective>-<task>")
    resume: bool = setting(False, "continue the run in out_dir exactly where it stopped, "
                                  "with its settings")
    overwrite: bool = setting(False,
                              "start afresh in an out_dir holding a checkpoint (replacing it)")
    vocab_size: int = setting(8192, "WordPiece vocabulary size when one is trained")
    seq_len: int = setting(0, "passage / source budget in tokens; "
                              "0 = 128 (tiny pre-training) or max_position")
    batch_size: int = setting(32, "examples per rank and micro-step")
    grad_accum: int = setting(1, "micro-steps per optimizer step")
    max_steps: int = setting(600, "optimizer steps of the whole run (the schedule's length)")
    stop_at: int = setting(0, "stop after this step as if interrupted (checkpoint kept); 0 = never")
    time_limit: float = setting(0.0, "minutes; stop at the next log step after this much training "
                                     "time; 0 = none")
    lr: float = setting(2e-3, "peak learning rate")
    warmup_steps: int = setting(-1, "linear warmup steps; -1 = 5% of max_steps")
    min_lr_frac: float = setting(0.0, "the linear decay ends at lr * min_lr_frac")
    weight_decay: float = setting(0.01,
                                  "AdamW weight decay (not on biases, LayerNorms, position tables)")
    beta2: float = setting(0.98, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the gradient norm to this; 0 = no clipping")
    label_smoothing: float = setting(-1.0, "-1 = 0.1 when fine-tuning (the papers' setting), "
                                           "0 when pre-training")
    eval_interval: int = setting(200, "evaluate on the held-out split every this many steps")
    eval_batches: int = setting(10, "held-out batches per evaluation")
    log_interval: int = setting(10, "log (and check for a stop request) every this many steps")
    ckpt_interval: int = setting(200, "write a checkpoint every this many steps")
    seed: int = setting(1337, "seed of the data order, the masking and dropout")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N")
    compile: str = setting("auto", "compile the blocks (fast.speed_up): auto (CUDA) | true | false")
    workers: int = setting(-1, "processes building batches (a DataLoader's); "
                               "-1 = 2 on CUDA, 0 on a CPU")
    cache_dir: str = setting(".cache", "where the vocabulary and the tokenized data are cached")
    progress: bool = setting(True, "show progress bars")


# a resumed run keeps its settings; these may change without changing what it computes
SAFE_ON_RESUME = {"resume", "out_dir", "stop_at", "time_limit", "log_interval", "eval_interval",
                  "eval_batches", "ckpt_interval", "device", "compile", "workers", "cache_dir",
                  "progress", "overwrite"}
SAFE_MODEL_ON_RESUME = {"attn_impl"}
PER_INVOCATION = {"resume", "overwrite", "stop_at", "time_limit"}
# the model shapes a checkpoint fixes
SHAPE_KEYS = ("vocab_size", "n_layer", "n_head", "n_embd", "ffn_dim", "max_position", "n_segment",
              "rel_pos_buckets", "rel_pos_max_distance")
# the sequence budget of the tiny preset's pre-training: a laptop's
TINY_SEQ_LEN = 128
# The tiny preset is the laptop's recipe, chosen by measurement (bench/recipe_sweep.py,
# bench/RESULTS.md): a fresh run of a tiny model (or a fine-tuning of one) takes these values for
# the settings no flag gives.
RECIPES = {"tiny": dict(vocab_size=4096, lr=1e-3, batch_size=16, max_steps=2200)}


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
    """-> (TrainConfig, model flags, objective flags, the keys given); unknown keys list the known
    ones."""
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
            raise UsageError(f"unknown setting --{key} (python train.py --help lists them). "
                             f"training: {sorted(train_defaults)}; "
                             f"model: {sorted(model_fields())}; "
                             f"objective {name!r}: {sorted(option_defaults)}")
    return TrainConfig(**cfg), model_flags, obj_flags, set(raw)


def help_text(name):
    """Every setting with its default and its one-line description: python train.py
    [--objective X] --help."""
    row = lambda key, default, text: f"  --{key:<21} {default!r:<11} {text}"
    recipe = ", ".join(f"--{k} {v}" for k, v in RECIPES["tiny"].items())
    lines = [__doc__.split("\n\n")[0], "",
             f"training (the tiny preset's recipe, for what no flag gives: {recipe}):"]
    lines += [row(f.name, f.default, f.metadata["help"]) for f in fields(TrainConfig)]
    lines += ["", ("model (model.ModelConfig; the preset sets them first, a checkpoint fixes the "
                   "shapes):")]
    lines += [row(f.name, f.default, f.metadata["help"]) for f in fields(M.ModelConfig)
              if f.name != "vocab_size"]
    lines += ["", (f"objective {name!r} (objectives/{OBJECTIVES[name]}.py; "
                   "--objective NAME --help for another):")]
    lines += [row(key, opt.default, opt.help)
              for key, opt in objective_class(name).option_table().items()]
    return "\n".join(lines)


def check_settings(cfg, given):
    """Every value in range, before anything is read or written: one clear error, never a hang or a
    crash."""
    at_least_one = ("batch_size", "grad_accum", "max_steps", "log_interval", "eval_interval",
                    "ckpt_interval")
    for key in at_least_one:
        if getattr(cfg, key) < 1:
            raise UsageError(f"--{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("stop_at", "eval_batches", "seq_len", "time_limit", "grad_clip", "weight_decay"):
        if getattr(cfg, key) < 0:
            raise UsageError(f"--{key} must be >= 0, got {getattr(cfg, key)}")
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
    if cfg.compile not in ("auto", "true", "false"):
        raise UsageError(f"--compile {cfg.compile!r}: choose auto, true or false")
    if cfg.workers < -1:
        raise UsageError(f"--workers must be >= 0 (or -1 = auto), got {cfg.workers}")
    if cfg.resume and cfg.init_from:
        raise UsageError("--resume continues a run; --init_from starts a new one from a "
                         "checkpoint: pick one")


# --------------------------------------------------------------------------------------------------
# 2. Distributed set-up: torchrun puts RANK / LOCAL_RANK / WORLD_SIZE in the environment


@dataclass
class Dist:
    ddp: bool
    rank: int
    world: int
    device: torch.device

    @property
    def master(self):
        return self.rank == 0


def setup_distributed(device_name):
    device = pick_device(device_name)
    if "RANK" not in os.environ:
        return Dist(False, 0, 1, device)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return Dist(True, rank, world, device)


# --------------------------------------------------------------------------------------------------
# 3. Start point: a fresh run, a run to resume, or a checkpoint to fine-tune


def out_dir_of(cfg):
    return Path(cfg.out_dir or f"out/{cfg.objective}-{cfg.task}")


def restore_settings(ckpt, cfg, model_flags, obj_flags, given, path):
    """A resumed run takes every setting from its checkpoint; a flag given again may only change a
    safe one."""
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
              for k, v in obj_flags.items()
              if v != ckpt["objective_options"].get(k)]
    if diffs:
        raise UsageError(f"{path}: a resumed run keeps its settings, and these differ: "
                         f"{'; '.join(diffs)}. Safe to change on --resume: "
                         f"{sorted(SAFE_ON_RESUME | SAFE_MODEL_ON_RESUME)}")
    # safe settings given again win; the ones that only steer one invocation
    # (a --stop_at of the first run must not stop the second) are this invocation's, given or not
    merged = {**saved, **{k: getattr(cfg, k) for k in SAFE_ON_RESUME
                          if k in given or k in PER_INVOCATION}}
    return TrainConfig(**merged), dict(ckpt["objective_options"])


def start_point(cfg, model_flags, obj_flags, given):
    """-> (checkpoint dict or None, settings, objective options) for a fresh, resumed or
    fine-tuning run."""
    out_dir = out_dir_of(cfg)
    if cfg.resume:
        path = out_dir / "ckpt.pt"
        if not path.exists():
            raise UsageError(f"--resume: no checkpoint {path} to continue (is --out_dir right?)")
        ckpt = read_checkpoint(path)
        cfg, obj_opts = restore_settings(ckpt, cfg, model_flags, obj_flags, given, path)
        return ckpt, cfg, obj_opts
    if (out_dir / "ckpt.pt").exists() and not cfg.overwrite:
        raise UsageError(f"{out_dir} holds the checkpoint of an earlier run: continue it with "
                         "--resume, start afresh there with --overwrite, or pick another --out_dir")
    ckpt = read_checkpoint(cfg.init_from) if cfg.init_from else None
    theirs = ckpt.get("train_config", {}).get("preset") if ckpt else None
    if ckpt and "preset" in given and cfg.preset != theirs:
        raise UsageError(f"--preset {cfg.preset} with --init_from: the checkpoint fixes the "
                         f"model's shape (it is a {theirs} model); drop --preset")
    return ckpt, cfg, dict(obj_flags)


def resolve_defaults(cfg, model_dict, given=(), preset=None):
    """The settings whose default depends on the run: the preset's recipe (preset: the
    checkpoint's when fine-tuning), seq_len, label_smoothing. Stored resolved in the checkpoint, so
    a resumed run is exact."""
    if not cfg.resume:
        for key, value in RECIPES.get(preset or cfg.preset, {}).items():
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


# --------------------------------------------------------------------------------------------------
# 4. Data


def prepare_data(cfg, obj_opts, tok, dist_):
    """-> (tokenizer, {"train", "valid"} examples, info). Rank 0 builds the caches first, the
    others then read them."""
    for turn in ((0, 1) if dist_.ddp else (0,)):
        if dist_.master == (turn == 0):
            tok, splits, info = load_data(cfg, obj_opts, tok, show=cfg.progress and dist_.master)
        if dist_.ddp:
            dist.barrier()
    return tok, splits, info


def load_data(cfg, obj_opts, tok, show):
    source = cfg.data or None
    if cfg.task == "pretrain":
        tok, splits, info = data.prepare_pretrain(source, cfg.vocab_size, cfg.cache_dir,
                                                  max_tokens=cfg.seq_len - 3, tokenizer=tok,
                                                  progress=show)
        if cfg.objective == "ernie_gen" and not obj_opts.get("span_vocab"):
            # ERNIE-GEN 3.3: the t-test span vocabulary,
            # built once per corpus beside the tokenized data
            from objectives.ernie_gen import build_span_vocab
            path = Path(info["cache_path"]) / "span_vocab.json"
            build_span_vocab(splits["train"], tok, cache_path=path, progress=show)
            obj_opts["span_vocab"] = str(path)
        return tok, splits, info
    # fine-tuning from scratch: the embedded corpus's vocabulary
    if tok is None:
        tok, _, _ = data.prepare_pretrain(None, cfg.vocab_size, cfg.cache_dir, progress=show)
    splits = data.prepare_seq2seq(source, tok, cfg.cache_dir, progress=show)
    return tok, splits, {split: len(v) for split, v in splits.items()}


def starting_tokenizer(cfg, ckpt):
    """The checkpoint's vocabulary, or --vocab's, or None (data.py trains one)."""
    if cfg.vocab:
        try:
            return WordPiece.from_file(cfg.vocab)
        except (OSError, ValueError) as e:
            raise UsageError(f"--vocab: {e}") from None
    if ckpt is not None:
        return WordPiece(ckpt["vocab"], ckpt.get("lowercase", True))
    return None


# --------------------------------------------------------------------------------------------------
# 5. Model


def model_settings(cfg, model_flags, ckpt):
    """ModelConfig fields: the preset, what the objective needs, the checkpoint's shapes, then the
    flags."""
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


def check_compatible(ckpt, model_cfg, tok, path):
    """Refuse a checkpoint whose vocabulary or model shape differs, naming the difference."""
    if ckpt["vocab"] != tok.vocab:
        diff = next((i for i, (a, b) in enumerate(zip(ckpt["vocab"], tok.vocab)) if a != b), None)
        where = (f", first at id {diff}: {ckpt['vocab'][diff]!r} vs {tok.vocab[diff]!r}"
                 if diff is not None else "")
        raise UsageError(f"{path}: its vocabulary ({len(ckpt['vocab'])} tokens) differs from "
                         f"this run's ({len(tok.vocab)} tokens){where}")
    theirs = ckpt["model_config"]
    ours = model_cfg.to_dict()
    diffs = [f"{k}: checkpoint {theirs.get(k)} vs now {ours[k]}" for k in SHAPE_KEYS
             if theirs.get(k) != ours[k]]
    if diffs:
        raise UsageError(f"{path} does not fit this model: " + "; ".join(diffs))


def build_model(cfg, model_dict, tok, ckpt, obj_opts, dist_):
    """-> (model on its device, objective); a checkpoint's weights loaded (strictly when
    resuming)."""
    try:
        model_cfg = M.ModelConfig.from_dict({**model_dict, "vocab_size": len(tok)})
        objective = get_objective(cfg.objective, tok, task=cfg.task, max_len=model_cfg.max_position,
                                  label_smoothing=cfg.label_smoothing, **obj_opts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if model_cfg.attn_impl == "flex" and dist_.device.type != "cuda":
        raise UsageError("--attn_impl flex trains on CUDA only "
                         "(FlexAttention has no backward on a CPU)")
    if ckpt is not None:
        check_compatible(ckpt, model_cfg, tok, cfg.init_from or out_dir_of(cfg) / "ckpt.pt")
    model = M.Transformer(model_cfg).to(dist_.device)
    if ckpt is not None:
        # fine-tuning may add a head the pre-trained model did not have (PALM's copy head):
        # strict only on resume
        missing, unexpected = model.load_state_dict(ckpt["model"], strict=cfg.resume)
        if dist_.master and (missing or unexpected):
            print(f"initialised from {cfg.init_from}; new: {missing}; unused: {unexpected}")
    return model, objective


# --------------------------------------------------------------------------------------------------
# 6. Optimizer and schedule


def make_optimizer(model, cfg, device):
    """AdamW; no weight decay on biases, LayerNorms, and the position/segment/relative-bias
    tables."""
    no_decay_names = ("pos_emb", "seg_emb", "rel_bias")
    decay = []
    no_decay = []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or any(n in name for n in no_decay_names) else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), eps=1e-6,
                             fused=device.type == "cuda")


def lr_at(step, cfg):
    """Linear warmup to lr, then linear decay to lr * min_lr_frac at max_steps."""
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else max(1, cfg.max_steps // 20)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, cfg.max_steps - warmup)
    return cfg.lr * (1 - (1 - cfg.min_lr_frac) * min(1.0, frac))


class LossModule(torch.nn.Module):
    """model + objective as one module, so that DDP sees the whole loss (heads included) inside its
    forward.

    Every parameter takes part in every step, so DDP needs no search for unused ones: the heads a
    batch may not use (UniLM's NSP head outside its bidirectional LM, PALM's copy head in stage 1)
    join the loss times zero.
    """

    def __init__(self, model, objective, heads):
        super().__init__()
        self.model = model
        self.objective = objective
        self.heads = heads

    def forward(self, batch):
        loss, metrics = self.objective.loss(self.model, batch)
        return loss + 0.0 * sum(p.sum() for p in self.heads), metrics


# --------------------------------------------------------------------------------------------------
# 7. The loop. Its state lives in one Run; the steps below are plain functions of it.


@dataclass
class Run:
    cfg: TrainConfig
    dist: Dist
    model: torch.nn.Module            # the bare model (what checkpoints hold)
    # the same, compiled and/or wrapped for DDP, with the objective's loss
    train_model: torch.nn.Module
    objective: object
    optimizer: torch.optim.Optimizer
    tok: WordPiece
    obj_opts: dict
    splits: dict
    out_dir: Path
    step: int = 0
    loader: object = None             # the DataLoader of StepBatches, and its iterator
    stream: object = None
    skipped: dict = None              # each batch-building process's count of skipped examples
    log_file: object = None
    bar: object = None
    stop: str = ""                    # why the loop ends early ("" = it does not)
    sums: dict = None                 # metrics summed since the last log, and their counts
    counts: dict = None
    # tokens, corpus tokens and FLOPs since the last log: tokens/s and MFU
    tokens: int = 0
    corpus_tokens: int = 0
    flops: float = 0.0
    t_last: float = 0.0
    t_start: float = 0.0
    # (1,) tensor: the first step whose loss was not finite (no host sync)
    first_bad: object = None
    recent: dict = None               # step -> the CPU batches of the steps since the last check

    @property
    def ckpt_path(self):
        return self.out_dir / "ckpt.pt"


class StepBatches(torch.utils.data.IterableDataset):
    """Every step's micro-batches, on the CPU, in the processes a DataLoader gives it (its workers
    on a GPU machine, so that building batches overlaps the GPU's work; the training process itself
    on a CPU).

    Step s of rank r always gets the same examples (data.batch_at: micro-batch s * grad_accum + m of
    the rank's stream) and the same randomness (seeded by seed, rank, step, micro), whichever
    process builds it: a resumed run replays exactly, and DDP ranks read disjoint shards. Worker w
    of W builds the steps s = w (mod W); the DataLoader hands them over in order.
    """

    def __init__(self, objective, examples, cfg, rank, world, start):
        self.objective = objective
        self.examples = examples
        self.cfg = cfg
        self.rank = rank
        self.world = world
        self.start = start

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        first, every = (worker.id, worker.num_workers) if worker else (0, 1)
        for step in range(self.start + first, self.cfg.max_steps, every):
            yield step, self.build(step), dict(self.objective.skipped)

    def build(self, step):
        cfg = self.cfg
        # PALM's two stages switch on the step
        self.objective.set_step(step, cfg.max_steps)
        batches = []
        for micro in range(cfg.grad_accum):
            examples = data.batch_at(self.examples, cfg.batch_size, cfg.seed,
                                     step * cfg.grad_accum + micro, self.rank, self.world)
            rng = random.Random(f"{cfg.seed}:{self.rank}:{step}:{micro}")
            batches.append(self.objective.make_batch(examples, rng))
        return batches


def batch_loader(run, start):
    """A DataLoader over StepBatches: pinned memory and prefetching on CUDA, persistent workers."""
    cfg = run.cfg
    dist_ = run.dist
    workers = cfg.workers if cfg.workers >= 0 else (2 if dist_.device.type == "cuda" else 0)
    dataset = StepBatches(run.objective, run.splits["train"], cfg, dist_.rank, dist_.world, start)
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                       pin_memory=dist_.device.type == "cuda",
                                       prefetch_factor=4 if workers else None,
                                       persistent_workers=workers > 0)


def train_step(run, autocast):
    """One optimizer step: forward and backward over the micro-batches, clip, AdamW."""
    cfg = run.cfg
    dist_ = run.dist
    lr = lr_at(run.step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    # one seed per (step, rank) for dropout: a resumed run replays exactly
    torch.manual_seed(cfg.seed * 100003 + run.step * dist_.world + dist_.rank)
    # the stage of PALM's schedule also in this process (its evaluation uses it)
    run.objective.set_step(run.step, cfg.max_steps)
    step, batches, skipped = next(run.stream)
    assert step == run.step, (step, run.step)
    run.skipped[step % max(1, run.loader.num_workers)] = skipped
    loss_sum = 0.0
    for micro, batch in enumerate(batches):
        count_work(run, batch)
        batch = batch.to(dist_.device)
        # DDP all-reduces gradients on the last micro-step only
        sync = micro == cfg.grad_accum - 1
        with (run.train_model.no_sync() if dist_.ddp and not sync else nullcontext()), autocast:
            loss, metrics = run.train_model(batch)
        (loss / cfg.grad_accum).backward()
        loss_sum = loss_sum + loss.detach()
        add_metrics(run, metrics)
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    # remember the first non-finite step on the device: checked at the next log, no sync here
    finite = torch.isfinite(torch.as_tensor(loss_sum, dtype=torch.float32, device=dist_.device))
    this_step = torch.tensor(run.step + 1, device=dist_.device)
    run.first_bad = torch.where(finite, run.first_bad, torch.minimum(run.first_bad, this_step))
    # what to say about this step if its loss turns out not finite
    last_ids = batches[-1].input_ids
    run.recent[run.step + 1] = (tuple(last_ids.shape), last_ids[0, :40].tolist(), loss_sum)
    run.step += 1
    run.bar.update(1)
    return lr


def count_work(run, batch):
    """Tokens and training FLOPs of a batch (counted on its CPU copy: no sync)."""
    n_tokens = batch.n_tokens
    # the share of rows that go through the output layer
    pred_frac = int((batch.labels != -100).sum()) / max(1, n_tokens)
    run.tokens += n_tokens
    run.corpus_tokens += run.objective.corpus_tokens(batch)
    run.flops += n_tokens * run.model.estimate_flops(batch.input_ids.size(1), pred_frac)


def add_metrics(run, metrics):
    """Sum each metric over the micro-steps and steps where it appears (averaged when logged)."""
    for k, v in metrics.items():
        run.sums[k] = run.sums.get(k, 0.0) + (v.detach() if torch.is_tensor(v) else v)
        run.counts[k] = run.counts.get(k, 0) + 1


def check_health(run):
    """At a log step: stop on a non-finite loss (naming its batch), and agree across ranks on
    stopping."""
    cfg = run.cfg
    dist_ = run.dist
    out_of_time = cfg.time_limit and time.time() - run.t_start > 60 * cfg.time_limit
    stop_flags = [float(bool(STOP_SIGNAL)), float(bool(out_of_time))]
    flags = torch.cat([run.first_bad.float(), torch.tensor(stop_flags, device=dist_.device)])
    if dist_.ddp:
        flags = flags.to("cpu" if dist.get_backend() == "gloo" else dist_.device)
        dist.all_reduce(flags[:1], op=dist.ReduceOp.MIN)
        dist.all_reduce(flags[1:], op=dist.ReduceOp.MAX)
    bad_step, signalled, timed_out = flags.tolist()
    if bad_step <= cfg.max_steps:
        describe_bad_batch(run, int(bad_step))
        raise SystemExit(1)
    run.recent = {}
    if signalled:
        run.stop = f"stopped by {STOP_SIGNAL[0] if STOP_SIGNAL else 'a signal on another rank'}"
    elif timed_out:
        run.stop = f"time limit of {cfg.time_limit} min reached"


def describe_bad_batch(run, step):
    if run.dist.master:
        shape, first_ids, loss = run.recent.get(step, ("?", [], float("nan")))
        first = run.tok.decode(first_ids)
        print(f"\nnon-finite loss {float(loss)} at step {step} (batch of {shape}, first example "
              f"starts: {first!r}); stopping. The last good checkpoint is kept: {run.ckpt_path}",
              file=sys.stderr)


def log_step(run, lr, peak):
    """tokens/s, MFU and the mean metrics since the last log: to the bar and to metrics.jsonl."""
    dt = time.time() - run.t_last
    world = run.dist.world
    tok_s = run.tokens * world / dt
    record = {"step": run.step, "split": "train", "lr": lr, "tokens_per_s": tok_s,
              "corpus_tokens_per_s": run.corpus_tokens * world / dt,
              **{k: float(v) / run.counts[k] for k, v in run.sums.items()}}
    if peak:
        record["mfu"] = run.flops / dt / peak
    shown = {"lr": f"{lr:.1e}", "tok_s": f"{tok_s:,.0f}"}
    if "loss" in record:
        shown["loss"] = f"{record['loss']:.3f}"
    if peak:
        shown["mfu"] = f"{record['mfu']:.1%}"
    run.bar.set_postfix(**shown)
    write_record(run, record)
    run.sums = {}
    run.counts = {}
    run.tokens = 0
    run.corpus_tokens = 0
    run.flops = 0.0
    run.t_last = time.time()


def write_record(run, record):
    if run.log_file:
        run.log_file.write(json.dumps(record) + "\n")
        run.log_file.flush()


@torch.no_grad()
def evaluate(model, objective, examples, cfg, device, autocast):
    """Mean metrics over the first eval_batches batches of the held-out split (fixed order and
    randomness)."""
    model.eval()
    sums = {}
    counts = {}
    batches = data.batches(examples, cfg.batch_size, seed=0, epoch=0, drop_last=False)
    for k, examples_k in zip(range(cfg.eval_batches), batches):
        batch = objective.make_batch(examples_k, random.Random(f"eval:{k}"))
        if len(batch) == 0:
            continue
        with autocast:
            _, metrics = objective.loss(model, batch.to(device))
        for key, v in metrics.items():
            v = float(v)
            if math.isfinite(v):
                sums[key] = sums.get(key, 0.0) + v
                counts[key] = counts.get(key, 0) + 1
    model.train()
    return {k: v / counts[k] for k, v in sums.items()}


def evaluate_step(run, autocast):
    if run.dist.master and run.splits["valid"]:
        metrics = evaluate(run.model, run.objective, run.splits["valid"], run.cfg, run.dist.device,
                           autocast)
        write_record(run, {"step": run.step, "split": "valid", **metrics})
        run.bar.write(f"step {run.step}: valid "
                      + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if run.cfg.progress:
            run.bar.write(show_fills(run, autocast))
    # evaluation time is not training throughput
    run.t_last = time.time()


def fills_example(examples, tok):
    """The held-out example the fills show: the first of 40 tokens or more that reads as prose
    (most pieces words, not the punctuation of a table or a code sample)."""
    def words(ids):
        pieces = [tok.id_to_token(i) for i in ids]
        return sum(p.lstrip("#").isalpha() for p in pieces) / max(1, len(pieces))
    flat = lambda ex: ex[0] if isinstance(ex, tuple) else [t for s in ex for t in s]
    prose = (ex for ex in examples if len(flat(ex)) >= 40 and words(flat(ex)) > 0.8)
    return next(prose, examples[0])


@torch.no_grad()
def show_fills(run, autocast, n_tokens=48):
    """What the model predicts on one fixed held-out example, so a reader watches it learn: the
    text with every predicted slot as [prediction|answer], then the query rows ([P], [ATTN], the
    continuation) the same way.
    Fine-tuning: the first held-out source, its greedy summary and the reference."""
    from objectives.masks import CTX
    tok = run.tok
    obj = run.objective
    model = run.model
    example = fills_example(run.splits["valid"], tok)
    if run.cfg.task == "seq2seq":
        from generate import generate
        # eagerly: capturing a CUDA graph for one short sample mid-training costs more than it saves
        hyp = generate(model, obj, [example[0]], beam_size=1, max_len=32, cuda_graph=False)[0][0][0]
        return (f"  source: {tok.decode(example[0][:n_tokens])} ...\n  model:  {tok.decode(hyp)}\n"
                f"  answer: {tok.decode(example[1])}")
    batch = obj.make_batch([example], random.Random("fills")).to(run.dist.device)
    if len(batch) == 0:
        return "  (the fixed held-out passage was skipped by the objective)"
    model.eval()
    with autocast:
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)[0]
    model.train()
    labels = batch.labels[0]
    kind = batch.kind[0]
    ids = batch.input_ids[0]
    rows = (labels != -100).nonzero().flatten()
    guess = dict(zip(rows.tolist(), model.lm_logits(h[rows]).argmax(-1).tolist()))
    piece = lambda i: tok.id_to_token(i)
    cell = lambda r: f"[{piece(guess[r])}|{piece(int(labels[r]))}]"
    context = [cell(r) if r in guess else piece(int(ids[r]))
               for r in range(len(ids)) if kind[r] == CTX]
    queries = [cell(r) for r in guess if kind[r] != CTX]
    right = sum(guess[r] == int(labels[r]) for r in guess)
    lines = [f"  fills [prediction|answer], {right}/{len(guess)} right:",
             "  " + " ".join(context[:n_tokens])]
    if queries:
        lines.append("  queries: " + " ".join(queries[:n_tokens // 2]))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# 8. Checkpoints, and the end of a run


def checkpoint(run, model_cfg):
    """Rank 0 writes atomically. The data position follows from the step (StepBatches): it is
    recorded, per rank, for readers; --resume needs only the step."""
    cfg = run.cfg
    per_epoch = data.num_batches(len(run.splits["train"]), cfg.batch_size, run.dist.world)
    epoch, index = divmod(run.step * cfg.grad_accum, per_epoch)
    states = [{"epoch": epoch, "index": index}] * run.dist.world
    if run.dist.master:
        save_checkpoint(run.ckpt_path, dict(
            model=run.model.state_dict(), model_config=model_cfg.to_dict(), vocab=run.tok.vocab,
            lowercase=run.tok.lowercase, objective=run.cfg.objective,
            objective_options=run.objective.opts, task=run.cfg.task, train_config=asdict(run.cfg),
            optimizer=run.optimizer.state_dict(), step=run.step, data_state=states,
            rng=dict(python=random.getstate(), torch=torch.get_rng_state())))


def open_metrics(run, ckpt_step):
    """metrics.jsonl: a fresh run starts it; a resumed one keeps the records up to its checkpoint,
    then appends."""
    path = run.out_dir / "metrics.jsonl"
    if run.cfg.resume and path.exists():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= ckpt_step]
        atomic_write(path, "".join(line + "\n" for line in kept))
        return open(path, "a", encoding="utf-8")
    run.out_dir.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8")


# Ctrl-C (SIGINT) and SIGTERM ask the loop to stop at the next log step, after a checkpoint; a
# second one stops at once (the last checkpoint is kept: they are written atomically).
STOP_SIGNAL = []


def request_stop(signum, frame):
    if STOP_SIGNAL:
        raise KeyboardInterrupt
    STOP_SIGNAL.append(signal.Signals(signum).name)


def resume_command(run):
    launcher = (f"torchrun --nproc_per_node {run.dist.world} train.py" if run.dist.ddp
                else "python train.py")
    return f"{launcher} --resume --out_dir {run.out_dir}"


def next_command(run):
    """What to try after a run: fine-tune a pre-trained model, or generate with a fine-tuned one."""
    if run.cfg.task == "pretrain":
        return (f"python train.py --objective {run.cfg.objective} --task seq2seq "
                f"--init_from {run.ckpt_path} --max_steps 1000")
    return (f"python data.py export --out docsum && python generate.py --ckpt {run.ckpt_path} "
            "--input docsum/test.src --output docsum/test.hyp --beam 5 --min_len 6 --max_len 32")


def loop(run, model_cfg, autocast):
    """Steps until max_steps, --stop_at, a stop request or the time limit; a checkpoint at every
    interval and at the end. Log, evaluation and checkpoint steps come in that order after a
    step."""
    cfg = run.cfg
    peak = M.peak_flops(run.dist.device)
    last = min(cfg.max_steps, cfg.stop_at or cfg.max_steps)
    while run.step < last and not run.stop:
        lr = train_step(run, autocast)
        due = {k: run.step % getattr(cfg, f"{k}_interval") == 0 for k in ("log", "eval", "ckpt")}
        if not (any(due.values()) or run.step == last):
            continue
        # one host sync: was every loss finite, and does any rank ask to stop?
        check_health(run)
        end = run.step == last or bool(run.stop)
        if due["log"] or end:
            log_step(run, lr, peak)
        if due["eval"] or end:
            evaluate_step(run, autocast)
        if due["ckpt"] or end:
            checkpoint(run, model_cfg)


def finish(run):
    """The last words: where the checkpoint is, and what to run next (or how to resume)."""
    if run.dist.ddp:
        check_replicas_agree(run.model, run.dist.world, run.dist.master)
    if not run.dist.master:
        return
    skipped = {}
    for counts in run.skipped.values():
        for reason, n in counts.items():
            skipped[reason] = skipped.get(reason, 0) + n
    if skipped:
        print(f"examples the objective skipped, by reason: {skipped}")
    print(f"{run.stop or 'done'}: {run.step} of {run.cfg.max_steps} steps; "
          f"checkpoint {run.ckpt_path}; metrics {run.out_dir / 'metrics.jsonl'}")
    if run.step < run.cfg.max_steps:
        print(f"continue with: {resume_command(run)}")
    else:
        print(f"next: {next_command(run)}")


def check_replicas_agree(model, world, master):
    """DDP keeps every rank's replica identical; verify it once at the end (a cheap checksum per
    rank)."""
    with torch.no_grad():
        checksum = torch.stack([p.double().abs().sum() for p in model.parameters()]).sum().cpu()
    sums = [None] * world
    dist.all_gather_object(sums, float(checksum))
    if master:
        same = all(s == sums[0] for s in sums)
        print(f"DDP: parameter checksums of the {world} ranks: {sums} -> "
              f"{'identical' if same else 'DIFFERENT'}")
        if not same:
            raise SystemExit("DDP replicas diverged")


# --------------------------------------------------------------------------------------------------
# The run, phase by phase


def main(argv):
    # 1. settings: parsed and checked before anything is read or written
    if "--help" in argv or "-h" in argv:
        raw = split_argv([a for a in argv if a not in ("--help", "-h")])
        print(help_text(raw.get("objective") or TrainConfig.objective))
        return
    cfg, model_flags, obj_flags, given = parse_args(argv)
    check_settings(cfg, given)
    # 2. distributed set-up
    dist_ = setup_distributed(cfg.device)
    if dist_.device.type == "cuda" and "OMP_NUM_THREADS" not in os.environ:
        # the CPU only builds batches here: a few threads do it,
        # and several processes x all cores thrash
        torch.set_num_threads(min(4, torch.get_num_threads()))
    torch.manual_seed(cfg.seed)
    # 3. start point
    ckpt, cfg, obj_opts = start_point(cfg, model_flags, obj_flags, given)
    if ckpt is not None and cfg.resume and len(ckpt["data_state"]) != dist_.world:
        raise UsageError(f"the run was trained on {len(ckpt['data_state'])} process(es); "
                         "resume it on as many")
    model_dict = model_settings(cfg, model_flags, ckpt)
    trained_as = ckpt.get("train_config", {}).get("preset") if ckpt is not None else None
    resolve_defaults(cfg, model_dict, given, trained_as)
    # 4. data
    tok, splits, info = prepare_data(cfg, obj_opts, starting_tokenizer(cfg, ckpt), dist_)
    # 5. model
    model, objective = build_model(cfg, model_dict, tok, ckpt, obj_opts, dist_)
    # 6. optimizer
    optimizer = make_optimizer(model, cfg, dist_.device)
    if data.num_batches(len(splits["train"]), cfg.batch_size, dist_.world) == 0:
        raise UsageError(f"{len(splits['train'])} training examples are too few for "
                         f"--batch_size {cfg.batch_size} on {dist_.world} process(es)")
    run = start_run(cfg, dist_, model, objective, optimizer, tok, obj_opts, splits, ckpt)
    del ckpt
    # 7. the loop, interruptible: Ctrl-C or SIGTERM end it cleanly with a checkpoint
    describe(run, info)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if dist_.device.type == "cuda"
                else nullcontext())
    handlers = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        loop(run, model.config, autocast)
        # 8. the end
        finish(run)
        stopped_by = STOP_SIGNAL[0] if STOP_SIGNAL else None
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        STOP_SIGNAL.clear()
        cleanup(run)
    if stopped_by:
        # the shell's convention for "ended by a signal" (130 for Ctrl-C),
        # after a clean stop and a checkpoint
        raise SystemExit(128 + signal.Signals[stopped_by].value)


def start_run(cfg, dist_, model, objective, optimizer, tok, obj_opts, splits, ckpt):
    """The loop's state: where the data stream and the step counter start, the log file, the
    progress bar."""
    step = 0
    if cfg.resume:
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    cuda = dist_.device.type == "cuda"
    compiled = cfg.compile == "true" or (cfg.compile == "auto" and cuda)
    if compiled:
        # few distinct lengths, few compilations
        objective.pad_multiple = 64
    heads = [p for name, p in model.named_parameters()
             if name.startswith(("nsp_head.", "copy_head."))]
    # the GPU speed layer (fast.py): on CUDA a faster relative-bias backward and copy scores;
    # compiled blocks where asked
    fast.speed_up(model, compile=compiled)
    train_model = LossModule(model, objective, heads)
    if dist_.ddp:
        device_ids = [dist_.device] if cuda else None
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, device_ids=device_ids,
                                                                gradient_as_bucket_view=True)
    run = Run(cfg, dist_, model, train_model, objective, optimizer, tok, obj_opts, splits,
              out_dir_of(cfg), step=step, skipped={}, sums={}, counts={}, recent={})
    run.loader = batch_loader(run, step)
    run.stream = iter(run.loader)
    run.first_bad = torch.tensor([cfg.max_steps + 1], device=dist_.device)
    if dist_.master:
        run.log_file = open_metrics(run, step)
    show = dist_.master and cfg.progress
    run.bar = tqdm(total=cfg.max_steps, initial=step, disable=not show, dynamic_ncols=True)
    run.t_start = run.t_last = time.time()
    return run


def describe(run, info):
    if run.dist.master:
        cfg = run.cfg
        m = run.model
        n_all = sum(p.numel() for p in m.parameters())
        n_body = m.num_params()
        print(f"unigen | {cfg.objective} / {cfg.task} | {m.config.n_layer} layers, "
              f"{m.config.n_embd} wide, {n_body / 1e6:.2f}M parameters "
              f"(+{(n_all - n_body) / 1e6:.2f}M in embeddings) | vocab {len(run.tok)} | "
              f"{run.dist.world} process(es) on {run.dist.device} | data: {info}")


def cleanup(run):
    # the DataLoader's workers end with it
    run.stream = run.loader = None
    if run.bar is not None:
        run.bar.close()
    if run.log_file:
        run.log_file.close()
    if run.dist.ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UsageError as e:
        exit_with_error("train.py", e)

"""Pre-train or fine-tune the one backbone with any of the four papers' objectives.

    python train.py --objective pmlm    # the main job: tiny model, embedded corpus, a laptop CPU
    python train.py --help              # every setting, with the value this run would use
    torchrun --nproc_per_node 2 train.py --objective pmlm --out_dir out/pmlm-ddp  # 2 processes
    python train.py --task seq2seq --init_from out/pmlm-pretrain/ckpt.pt  # fine-tune: docsum
    python train.py --resume --out_dir out/pmlm-pretrain                  # continue exactly

Every setting is a `--key value` flag (config.py): TrainConfig's, ModelConfig's (`--n_layer 4`)
and the objective's options (e.g. objectives/pmlm.py). A mistake is one line, exit status 2.

The run reads top to bottom in numbered phases, the functions in the order main (at the end)
calls them:
  1. settings      2. distributed set-up      3. start point (fresh, --resume, --init_from)
  4. data          5. model (on a GPU, the fast layer)                  6. optimizer
  7. the loop      batches -> loss -> backward -> step; log, evaluate, checkpoint
  8. the end       a checkpoint, and what to run next
Exit status, a contract scripts may rely on: 0 the run ended (max_steps, --stop_at or
--time_limit, with a checkpoint); 2 a mistake in a flag or a data file (one line); 3 (DIVERGED) a
loss turned NaN or infinite: the run stops at the next log step naming the batch and keeps the
last good checkpoint, so a harness (bench/study.py) records it as diverged instead of retrying;
128 + the signal's number after Ctrl-C or SIGTERM stopped it cleanly with a checkpoint (130, 143).
docs/how-it-fits-together.md follows `--objective pmlm` through these phases to the loss.
Precision (--dtype): autocast in bf16 on cards that compute it natively (compute capability 8.0
on), in fp16 with torch's loss scaler on older ones (T4, V100), none on a CPU.
Left out: multi-node launching (torchrun's --nnodes), FSDP/tensor parallelism.
"""
import functools
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

import data
import evaluate as E
import fast
import generate as G
import model as M
from config import (PASSAGE_SPECIALS, TrainConfig, check_compatible, check_settings, help_text,
                    model_settings, next_command, out_dir_of, parse_args, resolve_defaults,
                    resume_command, start_point, starting_tokenizer)
from generate import show_summary
from objectives import Objective, fills_example, get_objective, objective_class
from tokenizer import WordPiece
from utils import (Dist, UsageError, check_replicas_agree, exit_with_error, master_first,
                   one_line_warnings, open_log, save_checkpoint, setup_distributed)

# 1. Settings: config.py (TrainConfig, parse_args, check_settings, help_text)
# 2. Distributed set-up: utils.setup_distributed (torchrun's RANK / WORLD_SIZE)
# 3. Start point: config.start_point (a fresh run, a run to resume, or a checkpoint to fine-tune),
#    then config.model_settings and resolve_defaults (the preset's recipe and shape)


# --- 3. Start point (config.py), and the precision this device computes in ---------------------
def pick_dtype(cfg, device):
    """--dtype on this device (model.device_dtype): 'bf16', 'fp16' or 'fp32', or a UsageError."""
    try:
        return M.device_dtype(cfg.dtype, device)
    except ValueError as e:
        raise UsageError(str(e)) from None


# --- 4. Data --------------------------------------------------------------------------------------
def load_data(cfg, obj_opts, tok, show):
    """-> (tokenizer, {"train", "valid"} examples, objective options, info): the corpus or the
    (source, target) pairs, then what the objective prepares from the training split."""
    source = cfg.data or None
    if cfg.task == "pretrain":
        tok, splits, info = data.prepare_pretrain(source, cfg.vocab_size, cfg.cache_dir,
                                                  max_tokens=cfg.seq_len - PASSAGE_SPECIALS,
                                                  tokenizer=tok, progress=show,
                                                  one_per_line=cfg.one_document_per_line)
        cache = info["cache_path"]
    else:
        # fine-tuning from scratch: the embedded corpus's vocabulary
        if tok is None:
            tok, _, _ = data.prepare_pretrain(None, cfg.vocab_size, cfg.cache_dir, progress=show)
        splits = data.prepare_seq2seq(source, tok, cfg.cache_dir, progress=show)
        info = {split: len(v) for split, v in splits.items()}
        cache = cfg.cache_dir
    obj_class = objective_class(cfg.objective)
    obj_opts = obj_class.prepare(obj_opts, tok, splits["train"], cache, cfg.task, progress=show)
    return tok, splits, obj_opts, info


# --- 5. Model -------------------------------------------------------------------------------------
def build_model(cfg, model_dict, tok, ckpt, obj_opts, dist_):
    """-> (model on its device, objective), a checkpoint's weights loaded (strictly on --resume)."""
    try:
        model_cfg = M.ModelConfig.from_dict({**model_dict, "vocab_size": len(tok)})
        objective = get_objective(cfg.objective, tok, task=cfg.task, max_len=model_cfg.max_position,
                                  label_smoothing=cfg.label_smoothing, **obj_opts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    model = M.Transformer(model_cfg).to(dist_.device)
    if ckpt is not None:
        check_compatible(ckpt, model_cfg, tok, cfg.init_from or out_dir_of(cfg) / "ckpt.pt")
        missing, unexpected = model.load_state_dict(ckpt["model"], strict=cfg.resume)
        if dist_.master and (missing or unexpected):
            print(f"initialised from {cfg.init_from}; new: {missing}; unused: {unexpected}")
    return model, objective


def check_fast_flags(cfg, attn_impl, device, dtype):
    """The fast layer's flags against this device and precision, in one line each, before any data
    is read (a flag this card cannot run should not wait for a corpus to be tokenized)."""
    if cfg.graph == "true" and device.type != "cuda":
        raise UsageError("--graph true replays CUDA graphs: it needs a CUDA device")
    if cfg.graph == "true" and dtype == "fp16":
        raise UsageError("--graph true: fp16's loss scaler runs outside a CUDA graph; "
                         "use --dtype bf16 or fp32, or --graph false")
    if attn_impl == "flex" and device.type != "cuda":
        raise UsageError("--attn_impl flex trains on CUDA only "
                         "(FlexAttention has no backward on a CPU)")
    if device.type != "cuda":
        return
    can = M.fast_pieces(torch.cuda.get_device_capability(device))
    if attn_impl == "flex" and not can["flex"]:
        raise UsageError(f"--attn_impl flex needs a card of compute capability "
                         f"{M.FAST_PIECES['flex'][0]}.0 or more; use --attn_impl sdpa")
    if cfg.compile == "true" and not can["compile"]:
        raise UsageError("--compile true: torch.compile's Triton kernels need compute capability "
                         "7.0 or more; use --compile auto")


def use_fast_layer(model, objective, cfg, device, dtype):
    """train.py's one door into the fast layer (fast/): on CUDA (or --compile true) compiled
    blocks, the GPU relative bias and copy scores; with --pack, several passages a row; with
    --graph, the step replayed as a CUDA graph. -> (pack, view, graph): what data.StepBatches does
    to every training batch (None: one passage a row), what the loss sees of the model for a batch
    (None: the model itself), and whether start_run replays the step (fast.GraphedLoss). On a CPU
    the readable path runs as it is."""
    # auto: on CUDA, where the step is bf16 or fp32
    graph = switched_on(cfg.graph, device) and dtype != "fp16"
    # the pieces this card runs (model.fast_pieces; main prints them once)
    can = M.fast_pieces(torch.cuda.get_device_capability(device) if device.type == "cuda" else None)
    compiled = switched_on(cfg.compile, device) and (device.type != "cuda" or can["compile"])
    if compiled:
        # few distinct lengths, few compilations
        objective.pad_multiple = 64
    # the count of rows changes (packed rows, or examples an objective skips) and so may the
    # width: the blocks compile once, for any shape (with static shapes the study's ERNIE-GEN
    # pre-training compiled 23 times in 200 steps, 4x slower: bench/RESULTS.md)
    fast.speed_up(model, compile=compiled, dynamic=True)
    if not switched_on(cfg.pack, device):
        return None, None, graph
    # compiled blocks or a CUDA graph: one row width (fast.SteadyPacking); else the width the
    # attention finds cheapest for each batch (fast.plan_packing)
    pack = (fast.SteadyPacking(multiple=64) if compiled or graph
            else functools.partial(fast.plan_packing, key_cost=fast.key_cost(model)))
    # a packed batch runs the blocks on its packed rows, unknown to the objective
    return pack, fast.packed, graph


def switched_on(setting, device):
    """An auto | true | false setting (--compile, --pack): auto means on CUDA."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


# --- 6. Optimizer ---------------------------------------------------------------------------------
def make_optimizer(model, cfg, device):
    """AdamW; no weight decay on biases, LayerNorms and position/segment/relative-bias tables."""
    no_decay_names = ("pos_emb", "seg_emb", "rel_bias")
    decay = []
    no_decay = []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or any(n in name for n in no_decay_names) else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    cuda = device.type == "cuda"
    # on a GPU one fused kernel; on a CPU each update runs over all tensors at once (foreach):
    # fewer Python steps, the same numbers as the one-tensor-at-a-time loop (tests/test_train.py)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), eps=1e-6,
                             fused=cuda, foreach=not cuda)


# --- 7. The loop: its state lives in one Run, the steps below are plain functions of it -----------
class LossModule(torch.nn.Module):
    """The model and the objective's loss as one module: what train_step calls and DDP wraps. DDP
    waits for a gradient of every parameter: the heads a batch may not use (objective.heads) join
    the loss times zero. view(model, batch): what the objective sees of the model for a batch (the
    fast layer's packed view; None: the model). docs/how-it-fits-together.md, "Through DDP"."""

    def __init__(self, model, objective, view=None):
        super().__init__()
        self.model = model
        self.objective = objective
        self.heads = objective.heads(model)
        self.view = view

    def forward(self, batch):
        model = self.model if self.view is None else self.view(self.model, batch)
        loss, metrics = self.objective.loss(model, batch)
        return loss + 0.0 * sum(p.sum() for p in self.heads), metrics


@dataclass
class Run:
    cfg: TrainConfig
    dist: Dist
    model: torch.nn.Module            # the bare model (what checkpoints hold)
    train_model: torch.nn.Module      # LossModule(model, objective), wrapped in DDP under torchrun
    graphed: object                   # --graph: fast.GraphedLoss of train_model (no DDP), else None
    objective: Objective
    optimizer: torch.optim.Optimizer
    tok: WordPiece
    splits: dict
    out_dir: Path
    step: int = 0
    # a DataLoader over data.StepBatches, and its iterator: (step, [Batch] * grad_accum, skipped)
    loader: torch.utils.data.DataLoader = None
    stream: object = None
    skipped: dict = field(default_factory=dict)  # each batch-building process's skipped examples
    log_file: object = None
    bar: object = None
    stop: str = ""                    # why the loop ends early ("" = it does not)
    # since the last log: every metric's values; tokens, corpus tokens and FLOPs (tokens/s, MFU)
    seen: dict = field(default_factory=dict)
    work: Counter = field(default_factory=Counter)
    t_last: float = 0.0
    t_start: float = 0.0
    # (1,) tensor: the first step whose loss was not finite (no host sync)
    first_bad: object = None
    recent: dict = field(default_factory=dict)  # step -> its last batch, until the next check
    scaler: object = None             # torch.amp.GradScaler: fp16's loss scaler (else off)
    best: dict = None                 # --eval_decode's best score so far: metric, score, step

    @property
    def ckpt_path(self):
        return self.out_dir / "ckpt.pt"


def start_run(cfg, dist_, model, objective, optimizer, tok, splits, ckpt, dtype, pack, view, graph):
    """The loop's state: the step and data stream it starts at, the log file, the progress bar
    (pack, view, graph: use_fast_layer's)."""
    step = 0
    if cfg.resume:
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
        trained_on = len(ckpt["data_state"])
        if dist_.master and trained_on != dist_.world:
            # config.shards_per_process shared the step's shards anew
            print(f"resumed on {dist_.world} process(es) instead of {trained_on}: each step keeps "
                  f"its {cfg.grad_accum * dist_.world} batches of {cfg.batch_size} examples, now "
                  f"--grad_accum {cfg.grad_accum} on each process")
    cuda = dist_.device.type == "cuda"
    train_model = LossModule(model, objective, view)
    graphed = None
    if graph:
        # forward, loss and backward as CUDA graphs; under torchrun no DDP wrapper: the replicas
        # start from rank 0's weights, and train_step averages the gradients in one call
        graphed = fast.GraphedLoss(train_model, tok.pad_id, M.DTYPES[dtype],
                                   grad_scale=1 / cfg.grad_accum)
        for t in model.state_dict().values() if dist_.ddp else ():
            dist.broadcast(t, 0)
    elif dist_.ddp:
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[dist_.device] if cuda else None, gradient_as_bucket_view=True)
    run = Run(cfg, dist_, model, train_model, graphed, objective, optimizer, tok, splits,
              out_dir_of(cfg), step=step)
    steps = data.StepBatches(objective, splits["train"], cfg.batch_size, cfg.grad_accum, cfg.seed,
                             cfg.max_steps, dist_.rank, dist_.world, start=step,
                             pack=pack)
    workers = cfg.workers if cfg.workers >= 0 else (2 if cuda else 0)
    run.loader = data.batch_loader(steps, workers, pin_memory=cuda)
    run.stream = iter(run.loader)
    run.first_bad = torch.tensor([cfg.max_steps + 1], device=dist_.device)
    if dist_.master:
        run.log_file = open_log(run.out_dir / "metrics.jsonl", step if cfg.resume else None)
    show = dist_.master and cfg.progress
    run.bar = tqdm(total=cfg.max_steps, initial=step, disable=not show, dynamic_ncols=True)
    run.t_start = run.t_last = time.time()
    return run


def carry_over(run, dtype, ckpt):
    """What the loop keeps besides the model, the optimizer and the data position: fp16's loss
    scaler (off in bf16 and fp32: its calls pass through), at the scale a resumed run had reached,
    and --eval_decode's best score. A fresh run in the folder it overwrites drops its best.pt."""
    run.scaler = torch.amp.GradScaler(run.dist.device.type, enabled=dtype == "fp16")
    if run.cfg.resume:
        # a scaler that was off (bf16, fp32) saved an empty state: this one starts afresh
        if ckpt.get("scaler"):
            run.scaler.load_state_dict(ckpt["scaler"])
        run.best = ckpt.get("best")
    elif run.dist.master:
        (run.out_dir / "best.pt").unlink(missing_ok=True)


def loop(run, autocast):
    """Steps until max_steps, --stop_at, a stop request or the time limit; a checkpoint at every
    interval and at the end. Log, evaluation and checkpoint come in that order after a step."""
    cfg = run.cfg
    peak = M.peak_flops(run.dist.device)
    last = min(cfg.max_steps, cfg.stop_at or cfg.max_steps)
    while run.step < last and not run.stop:
        lr = train_step(run, autocast)
        due = {k: run.step % getattr(cfg, f"{k}_interval") == 0 for k in ("log", "eval", "ckpt")}
        if not (any(due.values()) or run.step == last):
            continue
        check_health(run)
        end = run.step == last or bool(run.stop)
        if due["log"] or end:
            log_step(run, lr, peak)
        if due["eval"] or end:
            evaluate_step(run, autocast)
        if due["ckpt"] or end:
            checkpoint(run)


def train_step(run, autocast):
    """One optimizer step: forward and backward over the micro-batches, clip, AdamW (through fp16's
    loss scaler, whose calls pass through in bf16 and fp32)."""
    cfg = run.cfg
    dist_ = run.dist
    lr = lr_at(run.step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    # the objective's schedule (set_step) also in this process: its evaluation uses it
    run.objective.set_step(run.step, cfg.max_steps)
    step, batches, skipped = next(run.stream)
    assert step == run.step, (step, run.step)
    run.skipped[step % max(1, run.loader.num_workers)] = skipped
    loss_sum = 0.0
    for micro, batch in enumerate(batches):
        # dropout seeded by the shard (data.StepBatches.shard): a run resumed, even on another
        # number of processes, replays exactly
        torch.manual_seed(cfg.seed * 100003 + run.loader.dataset.shard(run.step, micro))
        count_work(run, batch)
        batch = batch.to(dist_.device)
        if run.graphed is not None:
            # --graph: forward, loss and backward in one replay (fast/train_graph.py)
            loss, metrics = run.graphed(batch)
        else:
            # DDP all-reduces gradients on the last micro-step only
            sync = micro == cfg.grad_accum - 1
            with (run.train_model.no_sync() if dist_.ddp and not sync else nullcontext()), autocast:
                loss, metrics = run.train_model(batch)
            # fp16: the loss scaled up, so that small gradients do not underflow to 0
            run.scaler.scale(loss / cfg.grad_accum).backward()
        loss_sum = loss_sum + loss.detach()
        for k, v in metrics.items():
            run.seen.setdefault(k, []).append(v.detach() if torch.is_tensor(v) else v)
    if run.graphed is not None and dist_.ddp:
        # what DDP's hooks do: the gradients averaged over the processes
        run.graphed.all_reduce()
    # fp16: the gradients back at their true size before the clip reads them
    run.scaler.unscale_(run.optimizer)
    scaled = run.scaler.is_enabled()
    if cfg.grad_clip > 0 or scaled:
        # foreach: one norm over all gradients at once, also on a CPU (the same numbers); fp16
        # without a clip measures it too (no clip: max_norm inf), to count the steps it skips
        norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip or math.inf,
                                              foreach=True)
        record_grad_norm(run, norm.detach(), scaled)
    # fp16: a step whose gradients overflowed is skipped, and the scale halved; else AdamW's step
    run.scaler.step(run.optimizer)
    run.scaler.update()
    # a CUDA graph adds into the same gradient tensors every replay: zeroed, never dropped
    run.optimizer.zero_grad(set_to_none=run.graphed is None)
    watch_loss(run, loss_sum, batches[-1])
    run.step += 1
    run.bar.update(1)
    return lr


def lr_at(step, cfg):
    """Linear warmup to lr, then linear decay to lr * min_lr_frac at max_steps."""
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else max(1, cfg.max_steps // 20)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, cfg.max_steps - warmup)
    return cfg.lr * (1 - (1 - cfg.min_lr_frac) * min(1.0, frac))


def count_work(run, batch):
    """Tokens and training FLOPs of a batch (counted on its CPU copy: no sync)."""
    n_tokens = batch.n_tokens
    # the share of rows that go through the output layer
    pred_frac = int((batch.labels != -100).sum()) / max(1, n_tokens)
    # the blocks' row width: the packed one where the batch is packed
    width = batch.extras.get("pack_shape", batch.input_ids.shape)[1]
    run.work.update(tokens=n_tokens, corpus_tokens=run.objective.corpus_tokens(batch),
                    flops=n_tokens * run.model.estimate_flops(width, pred_frac))


def record_grad_norm(run, norm, scaled):
    """The norm before clipping, logged (a run about to diverge shows it growing first). fp16: a
    norm that is not finite is a step the scaler skips; noted, and its norm left out of the mean
    (scaler_record)."""
    if scaled:
        skipped = ~torch.isfinite(norm)
        run.seen.setdefault("skipped", []).append(skipped.float())
        norm = torch.where(skipped, 0.0, norm)
    run.seen.setdefault("grad_norm", []).append(norm)


def watch_loss(run, loss_sum, last_batch):
    """Note, on the device, whether this step's loss is finite, and what to say if it is not:
    check_health reads it at the next log step (one host sync there, none a step)."""
    finite = torch.isfinite(torch.as_tensor(loss_sum, dtype=torch.float32, device=run.dist.device))
    # the first non-finite step (a clamp by a Python number: a step tensor would copy to the GPU)
    run.first_bad = torch.where(finite, run.first_bad, run.first_bad.clamp(max=run.step + 1))
    ids = last_batch.input_ids
    run.recent[run.step + 1] = (tuple(ids.shape), ids[0, :40].tolist(), loss_sum)


# the exit status of a run stopped by a non-finite loss (the module docstring's contract)
DIVERGED = 3


def check_health(run):
    """At a log step, one host sync: stop on a non-finite loss (naming its batch), exit status
    DIVERGED; ranks agree."""
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
        if dist_.master:
            shape, first_ids, loss = run.recent.get(int(bad_step), ("?", [], float("nan")))
            print(f"\nnon-finite loss {float(loss)} at step {int(bad_step)} (batch of {shape}, "
                  f"first example starts: {run.tok.decode(first_ids)!r}); stopping. The last "
                  f"good checkpoint is kept: {run.ckpt_path}", file=sys.stderr)
        raise SystemExit(DIVERGED)
    run.recent = {}
    if signalled:
        run.stop = f"stopped by {STOP_SIGNAL[0] if STOP_SIGNAL else 'a signal on another rank'}"
    elif timed_out:
        run.stop = f"time limit of {cfg.time_limit} min reached"


def log_step(run, lr, peak):
    """tokens/s, MFU and the mean metrics since the last log: to the bar and to metrics.jsonl."""
    dt = time.time() - run.t_last
    world = run.dist.world
    tok_s = run.work["tokens"] * world / dt
    skipped = run.seen.pop("skipped", None)
    record = {"step": run.step, "split": "train", "lr": lr, "tokens_per_s": tok_s,
              "corpus_tokens_per_s": run.work["corpus_tokens"] * world / dt,
              **mean_over_ranks(run, {k: float(sum(v)) / len(v) for k, v in run.seen.items()})}
    if skipped is not None:
        scaler_record(run, record, skipped)
    shown = {"lr": f"{lr:.1e}", "tok_s": f"{tok_s:,.0f}"}
    if "loss" in record:
        shown["loss"] = f"{record['loss']:.3f}"
    if peak:
        record["mfu"] = run.work["flops"] / dt / peak
        shown["mfu"] = f"{record['mfu']:.1%}"
    run.bar.set_postfix(**shown)
    write_record(run, record)
    run.seen = {}
    run.work = Counter()
    run.t_last = time.time()


def mean_over_ranks(run, means):
    """Each metric's mean over the processes (those that saw it): the run's, not rank 0's share, so
    that the log reads the same on any number of processes (they hold equal numbers of shards)."""
    if not run.dist.ddp:
        return means
    gathered = [None] * run.dist.world
    dist.all_gather_object(gathered, means)
    keys = dict.fromkeys(k for g in gathered for k in g)
    return {k: sum(g[k] for g in gathered if k in g) / sum(k in g for g in gathered) for k in keys}


def scaler_record(run, record, skipped):
    """fp16: the steps its loss scaler skipped since the last log (a gradient overflowed), the
    scale now, and grad_norm averaged over the steps taken (a skipped one recorded 0)."""
    n = len(skipped)
    k = int(sum(skipped))
    record.update(skipped_steps=k, loss_scale=run.scaler.get_scale())
    if "grad_norm" in record:
        record["grad_norm"] = record["grad_norm"] * n / (n - k) if k < n else float("nan")


def write_record(run, record):
    if run.log_file:
        run.log_file.write(json.dumps(record) + "\n")
        run.log_file.flush()


def evaluate_step(run, autocast):
    """The held-out metrics (to metrics.jsonl) and the model's output on one held-out example."""
    if run.dist.master and run.splits["valid"]:
        metrics = evaluate(run.model, run.objective, run.splits["valid"], run.cfg, run.dist.device,
                           autocast)
        write_record(run, {"step": run.step, "split": "valid", **metrics})
        shown = {k: v for k, v in metrics.items() if k not in run.objective.tags}
        run.bar.write(f"step {run.step}: valid "
                      + ", ".join(f"{k} {v:.4f}" for k, v in shown.items()))
        example = fills_example(run.splits["valid"], run.tok)
        run.bar.write(show_summary(run.model, run.objective, example) if run.cfg.task == "seq2seq"
                      else run.objective.show_fills(run.model, example, run.dist.device, autocast))
        if run.cfg.eval_decode:
            decode_step(run, autocast)
    # evaluation time is not training throughput
    run.t_last = time.time()


@torch.no_grad()
def evaluate(model, objective, examples, cfg, device, autocast):
    """Mean metrics over the first eval_batches held-out batches (fixed order and randomness)."""
    model.eval()
    seen = {}
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
                seen.setdefault(key, []).append(v)
    model.train()
    return {k: sum(v) / len(v) for k, v in seen.items()}


def decode_step(run, autocast):
    """--eval_decode N, as the papers choose their checkpoint: the first N held-out sources decoded
    with the run's beam settings, scored against their targets (ROUGE-1/2/L F with stemming, or
    BLEU-4), to metrics.jsonl; the best so far kept as best.pt (model_state: what generate.py
    reads, no resume state), written atomically."""
    cfg = run.cfg
    pairs = run.splits["valid"][:cfg.eval_decode]
    with autocast:
        hyps = decode([src for src, _ in pairs], run, cfg)
    preds = [run.tok.decode(h[0][0], skip_special=True) if h else "" for h in hyps]
    refs = [run.tok.decode(tgt, skip_special=True) for _, tgt in pairs]
    scores = decode_scores(preds, refs, cfg.eval_metric)
    key = "rougeL" if cfg.eval_metric == "rouge" else "bleu"
    better = run.best is None or scores[key] > run.best["score"]
    if better:
        run.best = {"metric": key, "score": scores[key], "step": run.step}
        save_checkpoint(run.out_dir / "best.pt", {**model_state(run), "best": run.best})
    write_record(run, {"step": run.step, "split": "valid_decode", "sources": len(pairs), **scores,
                       "best": run.best["score"]})
    shown = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    kept = ("best so far: best.pt" if better
            else f"best {run.best['score']:.2f} at step {run.best['step']}")
    run.bar.write(f"step {run.step}: valid decode of {len(pairs)} sources (beam {cfg.eval_beam}): "
                  f"{shown}; {kept}")


def decode(sources, run, cfg):
    """The run's decoding of token-id sources (generate.py's readable search)."""
    return G.generate(run.model, run.objective, sources, beam_size=cfg.eval_beam,
                      max_len=cfg.eval_max_len, length_penalty=cfg.eval_length_penalty,
                      batch_size=cfg.batch_size)


def decode_scores(preds, refs, metric):
    """{"rouge1", "rouge2", "rougeL"} F x 100 (Porter-stemmed, as ROUGE-1.5.5 -m), or {"bleu"}."""
    if metric == "bleu":
        return {"bleu": E.bleu(preds, refs)}
    scores = E.rouge(preds, refs, stem=True)
    return {k: 100 * scores[k]["fmeasure"] for k in ("rouge1", "rouge2", "rougeL")}


def checkpoint(run):
    """Rank 0 writes atomically. data_state: where the next step starts in the data, once a process
    (their count is what a resume on another number of processes shares each step's shards by)."""
    states = [run.loader.dataset.position(run.step)] * run.dist.world
    if run.dist.master:
        save_checkpoint(run.ckpt_path, dict(
            **model_state(run), optimizer=run.optimizer.state_dict(), data_state=states,
            rng=dict(python=random.getstate(), torch=torch.get_rng_state()),
            scaler=run.scaler.state_dict(), best=run.best))


def model_state(run):
    """What every reader of a checkpoint needs: weights, settings, vocabulary (best.pt holds only
    this, as convert.py strip leaves a checkpoint; ckpt.pt adds the resume state)."""
    cfg = run.cfg
    return dict(model=run.model.state_dict(), model_config=run.model.config.to_dict(),
                vocab=run.tok.vocab, lowercase=run.tok.lowercase, objective=cfg.objective,
                objective_options=run.objective.opts, task=cfg.task, train_config=asdict(cfg),
                step=run.step)


# --- 8. The end -----------------------------------------------------------------------------------
# Ctrl-C (SIGINT) and SIGTERM ask the loop to stop at the next log step, after a checkpoint; a
# second one stops at once (the last checkpoint is kept: they are written atomically).
STOP_SIGNAL = []


def request_stop(signum, frame):
    if STOP_SIGNAL:
        raise KeyboardInterrupt
    STOP_SIGNAL.append(signal.Signals(signum).name)


def finish(run):
    """The last words: where the checkpoint is, and what to run next (or how to resume)."""
    if run.dist.ddp:
        check_replicas_agree(run.model, run.dist)
    if not run.dist.master:
        return
    # the summary's lines after the progress bar's, never on it
    run.bar.close()
    skipped = Counter()
    for counts in run.skipped.values():
        skipped.update(counts)
    if skipped:
        print(f"examples the objective skipped, by reason: {dict(skipped)}")
    print(f"{run.stop or 'done'}: {run.step} of {run.cfg.max_steps} steps; "
          f"checkpoint {run.ckpt_path}; metrics {run.out_dir / 'metrics.jsonl'}")
    print(f"continue with: {resume_command(run.cfg, run.dist.world)}"
          if run.step < run.cfg.max_steps else f"next: {next_command(run.cfg)}")


def cleanup(run):
    if run is None:
        return
    # the DataLoader's workers end with it
    run.stream = run.loader = None
    if run.bar is not None:
        run.bar.close()
    if run.log_file:
        run.log_file.close()
    if run.dist.ddp:
        dist.destroy_process_group()


# --- The run, phase by phase ----------------------------------------------------------------------
def main(argv):
    # 1. settings: parsed and checked before anything is read or written
    if "--help" in argv or "-h" in argv:
        print(help_text([a for a in argv if a not in ("--help", "-h")], __doc__.split("\n\n")[0]))
        return
    cfg, model_flags, obj_flags, given = parse_args(argv)
    check_settings(cfg)
    # 2. distributed set-up
    dist_ = setup_distributed(cfg.device)
    if dist_.device.type == "cuda" and "OMP_NUM_THREADS" not in os.environ:
        # the CPU only builds batches here: several processes x all cores would thrash
        torch.set_num_threads(min(4, torch.get_num_threads()))
    torch.manual_seed(cfg.seed)
    # 3. start point
    ckpt, cfg, obj_opts = start_point(cfg, model_flags, obj_flags, given, dist_.world)
    # the precision this device computes in (a resumed run's --dtype is its own)
    dtype = pick_dtype(cfg, dist_.device)
    model_dict = model_settings(cfg, model_flags, ckpt)
    resolve_defaults(cfg, model_dict, given, ckpt)
    check_fast_flags(cfg, model_dict.get("attn_impl", M.ModelConfig.attn_impl), dist_.device, dtype)
    # 4. data, and what the objective prepares from it (rank 0 builds the caches, the others read)
    with master_first(dist_):
        tok, splits, obj_opts, info = load_data(cfg, obj_opts, starting_tokenizer(cfg, ckpt),
                                                show=cfg.progress and dist_.master)
    # 5. model, and on a GPU the fast layer
    model, objective = build_model(cfg, model_dict, tok, ckpt, obj_opts, dist_)
    pack, view, graph = use_fast_layer(model, objective, cfg, dist_.device, dtype)
    # 6. optimizer
    optimizer = make_optimizer(model, cfg, dist_.device)
    # 7. the loop, interruptible: Ctrl-C or SIGTERM end it cleanly with a checkpoint (caught from
    # here on, so that the DataLoader's workers, started next, never die of the first one)
    handlers = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    run = None
    try:
        run = start_run(cfg, dist_, model, objective, optimizer, tok, splits, ckpt, dtype, pack,
                        view, graph)
        carry_over(run, dtype, ckpt)
        del ckpt
        if dist_.master:
            print(f"unigen | {cfg.objective} / {cfg.task} | {model.describe()} | vocab {len(tok)} "
                  f"| {dist_.world} process(es) on {dist_.device}, {dtype} | data: {info}")
            if dist_.device.type == "cuda":
                print(M.describe_fast_pieces(torch.cuda.get_device_capability(dist_.device)))
            if cfg.resume:
                print(f"resumed at step {run.step} of {cfg.max_steps} ({run.ckpt_path})")
        loop(run, M.autocast(dist_.device, dtype))
        # 8. the end
        finish(run)
        stopped_by = STOP_SIGNAL[0] if STOP_SIGNAL else None
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        STOP_SIGNAL.clear()
        cleanup(run)
    if stopped_by:
        # the shell's "ended by a signal" (130 for Ctrl-C), after a clean stop and a checkpoint
        raise SystemExit(128 + signal.Signals[stopped_by].value)


if __name__ == "__main__":
    one_line_warnings("train.py")
    try:
        main(sys.argv[1:])
    except UsageError as e:
        exit_with_error("train.py", e)
    except KeyboardInterrupt:
        # a second Ctrl-C, or one before the loop: checkpoints and caches are written atomically
        print("train.py: interrupted (the last checkpoint, if any, is kept)", file=sys.stderr)
        raise SystemExit(130)
    except BrokenPipeError:
        # whoever read our output left (python train.py --help | head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1)

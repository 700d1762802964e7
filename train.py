"""Pre-train or fine-tune the one backbone with any of the four papers' objectives.

    python train.py --objective pmlm    # the main job: tiny model, embedded corpus, a laptop CPU
    python train.py --help              # every setting, with the value this run would use
    torchrun --nproc_per_node 2 train.py --objective pmlm --out_dir out/pmlm-ddp  # 2 processes
    python train.py --task seq2seq --init_from out/pmlm-pretrain/ckpt.pt  # fine-tune: docsum
    python train.py --resume --out_dir out/pmlm-pretrain                  # continue exactly

Every setting is a `--key value` flag (config.py): TrainConfig's, ModelConfig's (`--n_layer 4`)
and the objective's options (e.g. objectives/pmlm.py). A mistake is one line, exit status 2.

The run reads top to bottom in numbered phases, which main (at the end) calls in turn:
  1. settings      2. distributed set-up      3. start point (fresh, --resume, --init_from)
  4. data          5. model (on a GPU, the fast layer)                  6. optimizer
  7. the loop      batches -> loss -> backward -> step; log, evaluate, checkpoint
  8. the end       a checkpoint, and what to run next
docs/how-it-fits-together.md follows `--objective pmlm` through these phases to the loss.
Left out: multi-node launching (torchrun's --nnodes), FSDP/tensor parallelism, fp16 loss scaling.
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
import fast
import model as M
from config import (PASSAGE_SPECIALS, TrainConfig, check_compatible, check_settings, help_text,
                    model_settings, next_command, out_dir_of, parse_args, resolve_defaults,
                    resume_command, start_point, starting_tokenizer)
from generate import show_summary
from objectives import Objective, fills_example, get_objective, objective_class
from tokenizer import WordPiece
from utils import (Dist, UsageError, check_replicas_agree, exit_with_error, master_first,
                   open_log, save_checkpoint, setup_distributed)

# 1. Settings: config.py (TrainConfig, parse_args, check_settings, help_text)
# 2. Distributed set-up: utils.setup_distributed (torchrun's RANK / WORLD_SIZE)
# 3. Start point: config.start_point (a fresh run, a run to resume, or a checkpoint to fine-tune),
#    then config.model_settings and resolve_defaults (the preset's recipe and shape)


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


def use_fast_layer(model, objective, cfg, device):
    """The one place train.py reaches for GPU speed (fast/): on CUDA (or --compile true) compiled
    blocks, the GPU relative bias and copy scores. On a CPU the readable path runs as it is."""
    if model.config.attn_impl == "flex" and device.type != "cuda":
        raise UsageError("--attn_impl flex trains on CUDA only "
                         "(FlexAttention has no backward on a CPU)")
    compiled = switched_on(cfg.compile, device)
    if compiled:
        # few distinct lengths, few compilations
        objective.pad_multiple = 64
    # the count of rows changes (packed rows, or examples an objective skips) and so may the
    # width: the blocks compile once, for any shape (with static shapes the study's ERNIE-GEN
    # pre-training compiled 23 times in 200 steps, 4x slower: bench/RESULTS.md)
    fast.speed_up(model, compile=compiled, dynamic=True)


def switched_on(setting, device):
    """An auto | true | false setting (--compile, --pack): auto means on CUDA."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def packing(cfg, model, device):
    """--pack: None (one passage a row, the readable layout) or what data.StepBatches does to every
    training batch: several passages a row, one width where the blocks are compiled
    (fast.SteadyPacking), else the width the attention finds cheapest (fast.plan_packing)."""
    if not switched_on(cfg.pack, device):
        return None
    if switched_on(cfg.compile, device):
        return fast.SteadyPacking(multiple=64)
    return functools.partial(fast.plan_packing, key_cost=fast.key_cost(model))


# --- 6. Optimizer and schedule --------------------------------------------------------------------
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


def lr_at(step, cfg):
    """Linear warmup to lr, then linear decay to lr * min_lr_frac at max_steps."""
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else max(1, cfg.max_steps // 20)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, cfg.max_steps - warmup)
    return cfg.lr * (1 - (1 - cfg.min_lr_frac) * min(1.0, frac))


class LossModule(torch.nn.Module):
    """The model and the objective's loss as one module: what train_step calls and DDP wraps. DDP
    waits for a gradient of every parameter: the heads a batch may not use (objective.heads) join
    the loss times zero. docs/how-it-fits-together.md, "Through DDP", follows the call."""

    def __init__(self, model, objective):
        super().__init__()
        self.model = model
        self.objective = objective
        self.heads = objective.heads(model)

    def forward(self, batch):
        # a packed batch (--pack) runs the blocks on its packed rows, unknown to the objective
        loss, metrics = self.objective.loss(fast.packed(self.model, batch), batch)
        return loss + 0.0 * sum(p.sum() for p in self.heads), metrics


# --- 7. The loop: its state lives in one Run, the steps below are plain functions of it ----------
@dataclass
class Run:
    cfg: TrainConfig
    dist: Dist
    model: torch.nn.Module            # the bare model (what checkpoints hold)
    train_model: torch.nn.Module      # LossModule(model, objective), wrapped in DDP under torchrun
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

    @property
    def ckpt_path(self):
        return self.out_dir / "ckpt.pt"


def train_step(run, autocast):
    """One optimizer step: forward and backward over the micro-batches, clip, AdamW."""
    cfg = run.cfg
    dist_ = run.dist
    lr = lr_at(run.step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    # one seed per (step, rank) for dropout: a resumed run replays exactly
    torch.manual_seed(cfg.seed * 100003 + run.step * dist_.world + dist_.rank)
    # the objective's schedule (set_step) also in this process: its evaluation uses it
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
        for k, v in metrics.items():
            run.seen.setdefault(k, []).append(v.detach() if torch.is_tensor(v) else v)
    if cfg.grad_clip > 0:
        # foreach: one norm over all gradients at once, also on a CPU (the same numbers)
        norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip, foreach=True)
        # the norm before clipping, logged (a run about to diverge shows it growing first)
        run.seen.setdefault("grad_norm", []).append(norm.detach())
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    # remember the first non-finite step on the device: checked at the next log, no sync here
    finite = torch.isfinite(torch.as_tensor(loss_sum, dtype=torch.float32, device=dist_.device))
    # (a clamp by a Python number: torch.tensor(step, device=...) would be a copy that waits for the GPU)
    run.first_bad = torch.where(finite, run.first_bad, run.first_bad.clamp(max=run.step + 1))
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
    # the blocks' row width: the packed one where the batch is packed
    width = batch.extras.get("pack_shape", batch.input_ids.shape)[1]
    run.work.update(tokens=n_tokens, corpus_tokens=run.objective.corpus_tokens(batch),
                    flops=n_tokens * run.model.estimate_flops(width, pred_frac))


# the exit status of a run stopped by a non-finite loss (a user's mistake is 2): bench/study.py
# records such a run as diverged instead of trying it again
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
    record = {"step": run.step, "split": "train", "lr": lr, "tokens_per_s": tok_s,
              "corpus_tokens_per_s": run.work["corpus_tokens"] * world / dt,
              **{k: float(sum(v)) / len(v) for k, v in run.seen.items()}}
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


def write_record(run, record):
    if run.log_file:
        run.log_file.write(json.dumps(record) + "\n")
        run.log_file.flush()


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
    # evaluation time is not training throughput
    run.t_last = time.time()


def checkpoint(run):
    """Rank 0 writes atomically; the data position is kept for readers (--resume needs the step)."""
    cfg = run.cfg
    states = [run.loader.dataset.position(run.step)] * run.dist.world
    if run.dist.master:
        save_checkpoint(run.ckpt_path, dict(
            model=run.model.state_dict(), model_config=run.model.config.to_dict(),
            vocab=run.tok.vocab, lowercase=run.tok.lowercase, objective=cfg.objective,
            objective_options=run.objective.opts, task=cfg.task, train_config=asdict(cfg),
            optimizer=run.optimizer.state_dict(), step=run.step, data_state=states,
            rng=dict(python=random.getstate(), torch=torch.get_rng_state())))


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
    skipped = Counter()
    for counts in run.skipped.values():
        skipped.update(counts)
    if skipped:
        print(f"examples the objective skipped, by reason: {dict(skipped)}")
    print(f"{run.stop or 'done'}: {run.step} of {run.cfg.max_steps} steps; "
          f"checkpoint {run.ckpt_path}; metrics {run.out_dir / 'metrics.jsonl'}")
    print(f"continue with: {resume_command(run.cfg, run.dist.world)}"
          if run.step < run.cfg.max_steps else f"next: {next_command(run.cfg)}")


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
    model_dict = model_settings(cfg, model_flags, ckpt)
    resolve_defaults(cfg, model_dict, given, ckpt)
    # 4. data, and what the objective prepares from it (rank 0 builds the caches, the others read)
    with master_first(dist_):
        tok, splits, obj_opts, info = load_data(cfg, obj_opts, starting_tokenizer(cfg, ckpt),
                                                show=cfg.progress and dist_.master)
    # 5. model, and on a GPU the fast layer
    model, objective = build_model(cfg, model_dict, tok, ckpt, obj_opts, dist_)
    use_fast_layer(model, objective, cfg, dist_.device)
    # 6. optimizer
    optimizer = make_optimizer(model, cfg, dist_.device)
    # 7. the loop, interruptible: Ctrl-C or SIGTERM end it cleanly with a checkpoint (caught from
    # here on, so that the DataLoader's workers, started next, never die of the first one)
    handlers = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    run = None
    try:
        run = start_run(cfg, dist_, model, objective, optimizer, tok, splits, ckpt)
        del ckpt
        if dist_.master:
            print(f"unigen | {cfg.objective} / {cfg.task} | {model.describe()} | vocab {len(tok)} "
                  f"| {dist_.world} process(es) on {dist_.device} | data: {info}")
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if dist_.device.type == "cuda"
                    else nullcontext())
        loop(run, autocast)
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


def start_run(cfg, dist_, model, objective, optimizer, tok, splits, ckpt):
    """The loop's state: the step and data stream it starts at, the log file, the progress bar."""
    step = 0
    if cfg.resume:
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    cuda = dist_.device.type == "cuda"
    train_model = LossModule(model, objective)
    if dist_.ddp:
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[dist_.device] if cuda else None, gradient_as_bucket_view=True)
    run = Run(cfg, dist_, model, train_model, objective, optimizer, tok, splits, out_dir_of(cfg),
              step=step)
    steps = data.StepBatches(objective, splits["train"], cfg.batch_size, cfg.grad_accum, cfg.seed,
                             cfg.max_steps, dist_.rank, dist_.world, start=step,
                             pack=packing(cfg, model, dist_.device))
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


if __name__ == "__main__":
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

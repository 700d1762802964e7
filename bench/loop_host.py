"""Where the host's time goes in train.py's step, phase by phase, with no synchronisation added inside a step.

    python bench/loop_host.py --objective palm --preset base --seq_len 512 --batch_size 32 --max_steps 60
    torchrun --nproc_per_node 1 bench/loop_host.py --objective unilm ...       # the same step under DDP
    DDP_KW='{"static_graph": true}' torchrun ...       # DDP built with these arguments besides train.py's own

Every argument goes to train.py unchanged. Each phase of train.train_step is timed on the host clock (the batch from
the DataLoader, its copy to the device, the work count, the forward (DDP's wrapper apart), the backward, the clip,
the optimizer, zero_grad); "rest" is what the step spends outside them. Steps START..STOP (LOOP_START, LOOP_STOP;
default 20..50) are averaged, and the wall time per step over them is taken between two synchronisations at their
ends. A phase's host time holds any wait for the GPU too (a launch waits when the GPU's queue is full), so a phase
that grows may be waiting rather than working. Rank 0 prints the table; writes loop_host_<label>_rank<r>.txt to
$OUT when set (label: LABEL, default the objective and the process count).
  SYNC_CHECK=1  the same steps under torch.cuda.set_sync_debug_mode("warn"): the calls that wait for the GPU,
                counted and named (bench/check_cuda.py's test of a warning); such a run's timings are not the loop's
  BARE_REPLAY=1 at step STOP, the batches of steps START..STOP again as bench_train.py's bare step (forward,
                backward, optimizer; the batches already on the device; no DataLoader, count, clip or loss check):
                the loop against its bare step on the same batches, same model, same process (issue 21 item 4)
  SPLIT_DDP=1   the blocks compiled as before the seventeenth session, dynamo's DDPOptimizer on (each block cut at
                DDP's buckets): the baseline of fast.compile_blocks's switch
  GC_FREEZE=1   gc.freeze() at step START: every object made so far (the model, the compiled graphs' caches) out
                of the garbage collector's reach, so a collection in the timed steps walks only the new ones
  FAST_CLIP=1   the clip as its four steps over a list of the parameters made once (a foreach norm per tensor,
                their norm, the factor, a foreach multiply: clip_grad_norm_'s own steps for one device and dtype,
                without its grouping and per-tensor copies)
                (twentieth session, PALM on one H200: neither gains; the collector takes 0.2 ms a step, the clip's
                host time stays 1.6-2.1 ms; bench/RESULTS.md)
  PIN_CPUS=1    each process of a run (LOCAL_RANK of LOCAL_WORLD_SIZE) kept to its own equal share of the host's
                cores, its threads as many, so host-bound ranks do not trade cores (on the lent 4x H200, one NUMA
                node for all 64 cores, it lost 3-7%: bench/RESULTS.md, nineteenth session)
The garbage collector's passes in the timed steps (and in the bare steps) are counted and timed apart: their time
is inside the phases above, wherever a pass fell.
"""
import functools
import gc
import json
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data                                           # noqa: E402
import fast                                           # noqa: E402
import objectives                                     # noqa: E402
import train                                          # noqa: E402
from bench.check_cuda import is_wait                  # noqa: E402
from config import parse_args                         # noqa: E402

START = int(os.environ.get("LOOP_START", 20))
STOP = int(os.environ.get("LOOP_STOP", 50))
RANK = int(os.environ.get("RANK", 0))
spent = defaultdict(float)                 # phase -> host seconds in steps START..STOP
state = {"step": 0, "on": False, "t0": None, "t1": None}
SYNC_CHECK = os.environ.get("SYNC_CHECK") == "1"
BARE_REPLAY = os.environ.get("BARE_REPLAY") == "1"
captured = []                              # BARE_REPLAY: each step's micro-batches in steps START..STOP
waits = []                                 # SYNC_CHECK: the warnings of calls that waited
GC_FREEZE = os.environ.get("GC_FREEZE") == "1"
FAST_CLIP = os.environ.get("FAST_CLIP") == "1"
collections = defaultdict(lambda: [0, 0.0])     # "loop" / "bare" -> [passes, seconds] of the garbage collector


def timed(name, fn):
    """fn, its host time added to `name` while steps START..STOP run."""
    def wrapper(*a, **kw):
        if not state["on"]:
            return fn(*a, **kw)
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[name] += time.perf_counter() - t
    return wrapper


class TimedLoader:
    """The DataLoader, its next batch timed as the phase "data"."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        it = iter(self.loader)

        def fetch():
            item = next(it)                # (step, [Batch] * grad_accum, skipped)
            if state["on"] and BARE_REPLAY:
                captured.append(item[1])
            return item
        return iter(timed("data", fetch), None)


def gc_timer(phase, info):
    """gc.callbacks: each pass of the garbage collector in the timed steps or the bare steps, counted and timed."""
    where = "loop" if state["on"] else "bare" if state.get("in_bare") else None
    if phase == "start":
        state["gc_t"] = time.perf_counter()
    elif where and state.get("gc_t") is not None:
        collections[where][0] += 1
        collections[where][1] += time.perf_counter() - state["gc_t"]


def fast_clip(parameters, max_norm, foreach=True):
    """FAST_CLIP=1: clip_grad_norm_'s steps for gradients of one device and dtype, over a list made once."""
    params = state.setdefault("params", list(parameters))
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def patch():
    gc.callbacks.append(gc_timer)
    if FAST_CLIP:
        torch.nn.utils.clip_grad_norm_ = fast_clip
    plain_loader = data.batch_loader
    data.batch_loader = lambda *a, **kw: TimedLoader(plain_loader(*a, **kw))
    objectives.Batch.to = timed("to device", objectives.Batch.to)
    train.count_work = timed("count work", train.count_work)
    train.LossModule.forward = timed("forward", train.LossModule.forward)
    ddp = torch.nn.parallel.DistributedDataParallel
    ddp.forward = timed("forward incl. DDP's wrapper", ddp.forward)
    extra = json.loads(os.environ.get("DDP_KW", "{}"))
    if extra:
        # train.py looks the class up at call time, so the partial is what it builds
        torch.nn.parallel.DistributedDataParallel = functools.partial(ddp, **extra)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = timed("clip", torch.nn.utils.clip_grad_norm_)
    torch.optim.AdamW.step = timed("optimizer", torch.optim.AdamW.step)
    torch.optim.AdamW.zero_grad = timed("zero_grad", torch.optim.AdamW.zero_grad)
    if os.environ.get("SPLIT_DDP") == "1":
        compile_blocks = fast.compile_blocks

        def split(model, dynamic=False):
            compile_blocks(model, dynamic)
            torch._dynamo.config.optimize_ddp = True
            return model
        fast.compile_blocks = split
    plain_step = train.train_step

    def step(run, autocast):
        if run.step == START and GC_FREEZE:
            gc.freeze()
        if run.step in (START, STOP):
            sync()
            state["t0" if run.step == START else "t1"] = time.perf_counter()
            state["on"] = run.step == START
            if run.step == STOP and BARE_REPLAY:
                state["in_bare"] = True
                state["bare"] = bare_steps(run, autocast)
                state["in_bare"] = False
        if SYNC_CHECK and state["on"]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    return plain_step(run, autocast)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    waits.extend(w for w in caught if is_wait(w.message))
        t = time.perf_counter()
        out = plain_step(run, autocast)
        if state["on"]:
            spent["step"] += time.perf_counter() - t
        return out
    train.train_step = step


def bare_steps(run, autocast):
    """ms a step of the captured batches run as bench_train.py's bare step, after one of them as warm-up."""
    on_device = [[b.to(run.dist.device) for b in micro] for micro in captured]

    def bare(micro):
        for b in micro:
            with autocast:
                loss, _ = run.train_model(b)
            loss.backward()
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    bare(on_device[0])
    sync()
    t = time.perf_counter()
    for micro in on_device:
        bare(micro)
    sync()
    return (time.perf_counter() - t) / len(on_device) * 1000


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def report():
    if state["t1"] is None:
        print("loop_host: the run ended before step", STOP, file=sys.stderr)
        return
    n = STOP - START
    if SYNC_CHECK:
        where = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in waits})
        print(f"rank {RANK}, steps {START}..{STOP}: {len(waits)} calls waited for the GPU "
              f"({', '.join(where[:6]) or 'none'})" + "".join(f"\n  {str(w.message)[:600]}" for w in waits[:2]),
              flush=True)
        return
    ms = {k: v / n * 1000 for k, v in spent.items()}
    wall = (state["t1"] - state["t0"]) / n * 1000
    # DDP's wrapper holds the module's forward: its own cost is the difference
    if "forward incl. DDP's wrapper" in ms:
        ms["DDP's forward wrapper"] = ms.pop("forward incl. DDP's wrapper") - ms["forward"]
    step = ms.pop("step")
    ms["rest of train_step"] = step - sum(ms.values())
    label = os.environ.get("LABEL") or f"{parse_args(sys.argv[1:])[0].objective}-{os.environ.get('WORLD_SIZE', 'plain')}"
    lines = [f"{label}, rank {RANK}, steps {START}..{STOP}: wall {wall:.1f} ms a step (synchronised at both ends); "
             f"host in train_step {step:.1f} ms ({step / wall:.0%})", "| phase | host ms a step |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in ms.items()]
    if "bare" in state:
        lines.append(f"bare steps on the same {len(captured)} batches: {state['bare']:.1f} ms a step; "
                     f"the loop runs at {state['bare'] / wall:.2f} of its bare step")
    # the bare steps: the captured batches and one warm-up
    for where, steps in (("loop", n), ("bare", len(captured) + 1 if "bare" in state else 0)):
        passes, seconds = collections[where]
        if steps:
            lines.append(f"garbage collector, {where} steps: {passes} passes, {seconds / steps * 1000:.2f} ms a step"
                         + (" (gc.freeze at the first)" if GC_FREEZE else ""))
    text = "\n".join(lines)
    if RANK == 0:
        print(text, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"loop_host_{label}_rank{RANK}.txt").write_text(text + "\n")


def pin_cpus():
    """PIN_CPUS=1: this process on its LOCAL_RANK's share of the cores it may use."""
    cores = sorted(os.sched_getaffinity(0))
    rank, n = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    share = cores[rank * len(cores) // n:(rank + 1) * len(cores) // n]
    os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))
    print(f"rank {RANK}: cores {share[0]}-{share[-1]}", flush=True)


if __name__ == "__main__":
    if os.environ.get("PIN_CPUS") == "1":
        pin_cpus()
    patch()
    try:
        train.main(sys.argv[1:])
    finally:
        report()

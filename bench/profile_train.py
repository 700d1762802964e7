"""A profile of train.py's own loop, one process or under torchrun: what the GPU runs in steps START..STOP, and
how long it waits.

    python bench/profile_train.py --objective unilm --preset base --seq_len 512 --batch_size 32 --max_steps 30
    torchrun --nproc_per_node 2 bench/profile_train.py --objective unilm ...     # the same under DDP

Every argument goes to train.py unchanged; PROFILE_START and PROFILE_STOP (default 20 and 25) pick the steps. Rank 0
prints the wall time per step, the GPU time per step by kind of kernel (NCCL's all-reduces run beside the
compute, so they are counted apart), the kernels that take the most time and the CPU calls that take the most time
(a host sync shows up there as cudaStreamSynchronize or aten::item / aten::nonzero). Writes profile_train_<rank>.txt
to $OUT when set.
"""
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train                                          # noqa: E402
from bench.profile_step import kind_of                # noqa: E402

START = int(os.environ.get("PROFILE_START", 20))
STOP = int(os.environ.get("PROFILE_STOP", 25))
RANK = int(os.environ.get("RANK", 0))
plain_step = train.train_step
state = {}


def report(prof, wall_ms, n):
    device = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    cpu = [e for e in prof.key_averages() if e.device_type.name == "CPU"]
    ms = lambda e: e.self_device_time_total / n / 1000
    by_kind = {}
    for e in device:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + ms(e)
    compute = sum(v for k, v in by_kind.items() if not k.startswith("communication"))
    lines = [f"rank {RANK}, steps {START}..{STOP}: wall {wall_ms:.1f} ms a step; GPU compute {compute:.1f} ms "
             f"({compute / wall_ms:.0%} of the wall time)",
             "| kind | ms a step |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    lines += ["| kernel | calls a step | ms a step |", "|---|---|---|"]
    lines += [f"| {e.key[:90]} | {e.count / n:.0f} | {ms(e):.2f} |" for e in sorted(device, key=ms, reverse=True)[:12]]
    lines += ["| CPU call | calls a step | self CPU ms a step |", "|---|---|---|"]
    cpu_ms = lambda e: e.self_cpu_time_total / n / 1000
    lines += [f"| {e.key[:90]} | {e.count / n:.0f} | {cpu_ms(e):.2f} |"
              for e in sorted(cpu, key=cpu_ms, reverse=True)[:12]]
    text = "\n".join(lines)
    if RANK == 0:
        print(text, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"profile_train_{RANK}.txt").write_text(text + "\n")


def profiled_step(run, autocast):
    """train.train_step, with the profiler started before step START and stopped after step STOP - 1."""
    if run.step == START:
        torch.cuda.synchronize()
        state["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        state["prof"].__enter__()
        state["t0"] = time.perf_counter()
    lr = plain_step(run, autocast)
    if run.step == STOP:
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - state["t0"]) / (STOP - START) * 1000
        state["prof"].__exit__(None, None, None)
        report(state["prof"], wall_ms, STOP - START)
    return lr


if __name__ == "__main__":
    assert torch.cuda.is_available(), "this profile needs a GPU"
    train.train_step = profiled_step
    train.main(sys.argv[1:])

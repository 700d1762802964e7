"""Where a bare training step's time goes: torch.profiler over a few steps of each run, kernels by kind.

    python bench/profile_step.py                                 # unilm, pmlm, pmlm on flex, palm with and without
                                                                 # its copy head
    python bench/profile_step.py --only "unilm,hf" --top 30      # beside HF BertForMaskedLM compiled
    python bench/profile_step.py --tiny                          # a CPU smoke run of the same code

The model, batches and step are bench/bench_train.py's (base preset, batch 32, 512 text tokens, bf16, the fast
layer as train.py switches it on, compiled blocks). For each run it prints the wall time a step (synchronised),
the GPU's busy time a step (the difference is time the GPU waited for the host), that time by kind of kernel
(matrix products, attention, index / scatter, the rest), the --top kernels, and on a GPU the host ops that take
the most CPU time. Runs (--only): unilm, unilm packed, pmlm, pmlm packed, pmlm flex, ernie_gen, palm (copy), palm
(no copy), hf; the packed ones in rows of one width (fast.SteadyPacking: the GPU's work of the CUDA-graph step of
fast/train_graph.py, whose replays the profiler does not break into kernels). Writes profile_step.txt to $OUT when
set.
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_train import build_step, corpus, hf_step, shape, sync, timed  # noqa: E402

RUNS = {"unilm": ("unilm", "sdpa", {}), "unilm packed": ("unilm", "sdpa", {"pack": True}),
        "pmlm": ("pmlm", "sdpa", {}), "pmlm packed": ("pmlm", "sdpa", {"pack": True}), "pmlm flex": ("pmlm", "flex", {}),
        "ernie_gen": ("ernie_gen", "sdpa", {}), "palm (copy)": ("palm", "sdpa", {}),
        "palm (no copy)": ("palm", "sdpa", {"copy": False}), "hf": ("hf", "sdpa", {})}
LINES = []


def say(*a):
    text = " ".join(str(x) for x in a)
    print(text, flush=True)
    LINES.append(text)


def kind_of(name):
    """A kernel's kind, from its name."""
    n = name.lower()
    if "nccl" in n:
        return "communication (NCCL)"
    # attention first: the memory-efficient kernels' names hold "cutlass" too
    if any(k in n for k in ("fmha", "flash", "attention", "flex", "triton_tem_fused", "_backward_q",
                            "_backward_kv")) or n == "_forward":
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "nvjet", "sm90_xmma", "matmul", "cublas")):
        return "matrix products"
    if any(k in n for k in ("index", "scatter", "embedding", "gather", "bincount", "histogram")):
        return "index / scatter"
    return "other"


def profile_steps(s, label, impl, args, device):
    """Time the steps, then profile them: tables of kernels by kind, the top kernels and host ops."""
    batches, step = s["batches"], s["step"]
    sec = timed(step, batches, args.warmup, device)
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for b in batches[args.warmup:]:
            step(b)
        sync(device)
    n = len(batches) - args.warmup
    events = [e for e in prof.key_averages() if e.device_type.name == ("CUDA" if cuda else "CPU")]
    attr = "self_cpu_time_total"
    if cuda:
        attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    total = sum(getattr(e, attr) for e in events) / n / 1000          # ms a step
    by_kind = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + getattr(e, attr) / n / 1000
    # the positions the blocks run a step (packed rows, or a row a passage with its padding; HF's: (ids, labels))
    slots = sum(math.prod(shape(b) or b[0].shape) for b in batches[args.warmup:]) / n
    say(f"\n### {label}, {impl}: wall {sec * 1000:.1f} ms a step, device busy {total:.1f} ms "
        f"({total / (sec * 1000):.0%}); {slots:,.0f} positions a step, {total / slots * 1000:.2f} us of device "
        "time a position")
    say("| kind | ms a step | share |\n|---|---|---|")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        say(f"| {kind} | {ms:.1f} | {ms / total:.0%} |")
    say("| kernel | calls a step | ms a step | share |\n|---|---|---|---|")
    for e in sorted(events, key=lambda e: -getattr(e, attr))[:args.top]:
        ms = getattr(e, attr) / n / 1000
        say(f"| {e.key[:90]} | {e.count / n:.0f} | {ms:.2f} | {ms / total:.1%} |")
    if cuda:
        # the host's side: where the CPU's time a step goes (what the GPU waits for, when it is not busy)
        host = [e for e in prof.key_averages() if e.device_type.name == "CPU"]
        say("| host op (self CPU time) | calls a step | ms a step |\n|---|---|---|")
        for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:12]:
            say(f"| {e.key[:90]} | {e.count / n:.0f} | {e.self_cpu_time_total / n / 1000:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="unilm,pmlm,pmlm flex,palm (copy),palm (no copy)",
                    help=f"comma-separated runs: {', '.join(RUNS)}")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cache", default=".cache")
    ap.add_argument("--eager", action="store_true", help="no compiled blocks")
    ap.add_argument("--top", type=int, default=15, help="kernels listed a run")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    labels = [x.strip() for x in args.only.split(",") if x.strip()]
    if unknown := [x for x in labels if x not in RUNS]:
        ap.error(f"--only: unknown run(s) {unknown}; known: {', '.join(RUNS)}")
    if args.tiny:
        args.preset, args.seq_len, args.batch, args.vocab, args.steps, args.warmup = "tiny", 64, 4, 1000, 2, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    say(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
        f"preset {args.preset}, batch {args.batch}, text {args.seq_len}, {time.strftime('%Y-%m-%d')}")
    tok, examples = corpus(args)
    for label in labels:
        name, impl, options = RUNS[label]
        if impl == "flex" and device.type != "cuda":
            continue
        try:
            if name == "hf":
                s = hf_step(args, device, len(tok), compiled=not args.eager)
            else:
                # "packed": several passages a row, one width (fast.SteadyPacking, as a CUDA-graph step packs)
                pack = options.get("pack", False)
                options = {k: v for k, v in options.items() if k != "pack"}
                s = build_step(name, impl, options, tok, examples, args, device, pack=pack, steady=pack)
            profile_steps(s, label, impl, args, device)
        except Exception as e:               # one failure does not hide the other runs
            say(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "profile_step.txt").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()

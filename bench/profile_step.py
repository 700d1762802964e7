"""Where a training step's GPU time goes, and UniLMv2's relative position bias implemented several ways.

    python bench/profile_step.py --part steps    # torch.profiler over a few bare steps of each run: the top kernels
    python bench/profile_step.py --only "pmlm,pmlm triton"   # the same for pmlm with fast/triton_bias.py's attention
    python bench/profile_step.py --only "pmlm triton,pmlm triton loop"   # its dQ kernel's bias gradient, new and old
    python bench/profile_step.py --part bias     # pmlm steps with each implementation of the relative bias
    python bench/profile_step.py --only "palm (copy),palm (compiled copy),palm (no copy)"   # PALM's copy head
    python bench/profile_step.py --part copy     # PALM's additive copy scores, several ways (Triton's too)
    python bench/profile_step.py --part triton   # fast/triton_bias.py (Triton) against SDPA: attention, pmlm step
    python bench/profile_step.py --tiny          # CPU smoke run of both parts

Same model, batches and step as bench/bench_train.py (base preset, batch 32, 512 text tokens, bf16, compiled
blocks). --part steps prints, per run, the GPU time per step by kind of kernel (matrix products, attention,
index/scatter, the rest), the wall time per step (the difference is time the GPU waited for the CPU) and the
15 kernels that take the most GPU time. --part bias times a full pmlm step with each way of computing the
relative bias and its gradient, the bias alone (forward + backward) for the dense (SDPA) ways, and pmlm without the
bias for reference. Writes profile_<part>.txt to $OUT when set.
"""
import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fast                                         # noqa: E402
import model as M                                   # noqa: E402
from objectives.masks import PAD                    # noqa: E402
from bench.bench_train import build_step, corpus, hf_step, sync, timed  # noqa: E402

LINES = []


def say(*a):
    text = " ".join(str(x) for x in a)
    print(text, flush=True)
    LINES.append(text)


# --------------------------------------------------------------------------------------------------
# --part steps: a profile of a few steps


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


def table_gradient(way):
    """Set how fast/triton_bias.py's dQ kernel sums the bias gradient by bucket ("prefix", the default, or "loop",
    the kernel before) -> the previous way."""
    from fast import triton_bias as FBA
    before, FBA.TABLE_GRADIENT = FBA.TABLE_GRADIENT, way
    return before


def profile_run(name, impl, options, label, tok, examples, args, device, triton=None):
    """triton: None (the step as built), or how the Triton kernel sums the bias gradient ("prefix", "loop").
    name "hf": HF BertForMaskedLM compiled (bench_train.hf_step), the baseline's kernels."""
    if name == "hf":
        return profile_steps(hf_step(args, device, len(tok), compiled=not args.eager), label, impl, args, device)
    s = build_step(name, impl, options, tok, examples, args, device)
    if triton:
        fast.use_triton_bias(s["model"])                 # the flex model's attention, by fast/triton_bias.py
        before = table_gradient(triton)
    try:
        profile_steps(s, label, impl, args, device)
    finally:
        if triton:
            table_gradient(before)


def profile_steps(s, label, impl, args, device):
    batches, step = s["batches"], s["step"]
    sec = timed(step, batches, args.warmup, device)
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for b in batches[args.warmup:]:
            step(b)
        sync(device)
    n = len(batches) - args.warmup
    events = [e for e in prof.key_averages() if e.device_type.name == ("CUDA" if device.type == "cuda" else "CPU")]
    attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    if device.type != "cuda":
        attr = "self_cpu_time_total"
    total = sum(getattr(e, attr) for e in events) / n / 1000          # ms per step
    by_kind = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + getattr(e, attr) / n / 1000
    say(f"\n### {label}, {impl}: wall {sec * 1000:.1f} ms a step, device busy {total:.1f} ms "
        f"({total / (sec * 1000):.0%})")
    say("| kind | ms a step | share |\n|---|---|---|")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        say(f"| {kind} | {ms:.1f} | {ms / total:.0%} |")
    say("| kernel | calls a step | ms a step | share |\n|---|---|---|---|")
    for e in sorted(events, key=lambda e: -getattr(e, attr))[:args.top]:
        ms = getattr(e, attr) / n / 1000
        say(f"| {e.key[:90]} | {e.count / n:.0f} | {ms:.2f} | {ms / total:.1%} |")
    if device.type == "cuda":
        # the host's side: where the CPU's time a step goes (what the GPU waits for, when it is not busy)
        host = [e for e in prof.key_averages() if e.device_type.name == "CPU"]
        say("| host op (self CPU time) | calls a step | ms a step |\n|---|---|---|")
        for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:12]:
            say(f"| {e.key[:90]} | {e.count / n:.0f} | {e.self_cpu_time_total / n / 1000:.2f} |")


# --------------------------------------------------------------------------------------------------
# --part bias: the relative position bias, several ways
#
# The dense ways make the (B, H, Lq, Lk) bias that SDPA adds to its scores; they differ in how the gradient of
# that tensor is summed back into the (buckets, heads) table.


def dense_model(self, q_pos, k_pos):
    """The fast layer's way on a GPU (fast.speed_up): fast.BucketBias (backward: chunked one-hot matrix
    products)."""
    w = self.table.weight
    return fast.BucketBias.apply(w, self.buckets(q_pos, k_pos), M.compute_dtype(q_pos.device, w.dtype))


def dense_index_select(self, q_pos, k_pos):
    """model.py's readable way: the table's rows by index_select; backward = index_add of B*Lq*Lk rows into 32."""
    return self.lookup(self.buckets(q_pos, k_pos))


def dense_embedding(self, q_pos, k_pos):
    """F.embedding: on CUDA its backward sorts the indices and sums each run."""
    return F.embedding(self.buckets(q_pos, k_pos), self.table.weight).permute(0, 3, 1, 2)


class OneHotBias(fast.BucketBias):
    """BucketBias with one product per example instead of per chunk of 64 rows."""

    @staticmethod
    def backward(ctx, g):
        buckets, = ctx.saved_tensors
        B, H, Lq, Lk = g.shape
        kinds = torch.arange(ctx.n_buckets, device=g.device)
        onehot = (buckets.view(B, Lq * Lk, 1) == kinds).to(g.dtype)         # (B, Lq*Lk, K)
        return torch.bmm(g.reshape(B, H, Lq * Lk), onehot).float().sum(0).t(), None, None


class BincountBias(fast.BucketBias):
    """BucketBias with the backward by torch.bincount per head (a weighted histogram; it waits for the GPU to
    size the histogram)."""

    @staticmethod
    def backward(ctx, g):
        buckets, = ctx.saved_tensors
        flat = buckets.flatten()
        cols = [torch.bincount(flat, weights=g[:, h].flatten().float(), minlength=ctx.n_buckets)
                for h in range(g.size(1))]
        return torch.stack(cols, 1), None, None


def dense_onehot(self, q_pos, k_pos):
    w = self.table.weight
    return OneHotBias.apply(w, self.buckets(q_pos, k_pos), M.compute_dtype(q_pos.device, w.dtype))


def dense_bincount(self, q_pos, k_pos):
    w = self.table.weight
    return BincountBias.apply(w, self.buckets(q_pos, k_pos), M.compute_dtype(q_pos.device, w.dtype))


DENSE = {"index_select (model.py)": dense_index_select, "BucketBias (fast/, GPU)": dense_model,
         "embedding": dense_embedding, "one-hot bmm per example": dense_onehot, "bincount": dense_bincount}

# The FlexAttention ways: the bias read inside the kernel; its gradient is added atomically into the table the
# score_mod reads, one add per (query, key, head).

def flex_one_table(self):
    """The score_mod before: one (2P - 1, H) table in the compute dtype (bf16), so the atomic adds of a tile's
    queries collide."""
    table = self.by_distance.to(torch.bfloat16)
    pos, offset = self.position_ids, self.offset

    def mod(score, b, h, q, k):
        return score + table[pos[b, k] - pos[b, q] + offset, h]
    return mod


FLEX = {"flex, one bf16 table": flex_one_table, "flex, 128 fp32 copies (fast/)": fast.FlexBias.score_mod}


def bias_alone(fn, rel_bias, B, L, device, reps=10):
    """ms for the bias and its gradient alone (the gradient a stand-in for what SDPA returns), and the bias and
    the table's gradient of one call."""
    # UniLMv2's positions: the text, then [P]s and originals reusing the positions of masked spans
    n = min(L * 3 // 4, rel_bias.offset + 1)
    pos = torch.cat([torch.arange(n), torch.arange(L - n) % (n // 2) + n // 4]).to(device).expand(B, L)
    g = torch.randn(B, rel_bias.table.weight.size(1), L, L, device=device).to(torch.bfloat16)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    out = {}

    def once(_):
        rel_bias.table.weight.grad = None
        with autocast:
            out["bias"] = fn(rel_bias, pos, pos).to(torch.bfloat16)
        out["bias"].backward(g)
    ms = timed(once, [None] * (reps + 2), 2, device) * 1000
    return ms, out["bias"].float(), rel_bias.table.weight.grad.clone()


def bias_part(tok, examples, args, device):
    rows = []
    # the dense ways, alone
    rel = M.RelativePositionBias(32, 128, 12, 512).to(device)
    B, L = (32, 704) if device.type == "cuda" else (2, 64)
    first = None
    for label, fn in DENSE.items():
        torch.manual_seed(1)
        ms, bias, grad = bias_alone(fn, rel, B, L, device)
        first = first or (bias, grad)
        err = lambda a, b: float((a - b).abs().max() / b.abs().max())
        say(f"bias alone, {label}: {ms:.2f} ms (forward + backward, B={B}, L={L}); against the first: bias "
            f"{err(bias, first[0]):.1e}, table gradient {err(grad, first[1]):.1e} (max error / max)")
    reference = M.RelativePositionBias.forward, fast.FlexBias.score_mod
    impls = ["sdpa"] + (["flex"] if device.type == "cuda" else [])
    for impl in impls:
        ways = DENSE if impl == "sdpa" else FLEX
        for label, fn in ways.items():
            if impl == "sdpa":
                M.RelativePositionBias.forward = fn
            else:
                fast.FlexBias.score_mod = fn
            try:
                s = build_step("pmlm", impl, {}, tok, examples, args, device)
                rows.append((label, timed(s["step"], s["batches"], args.warmup, device) * 1000))
            except Exception as e:          # one failure does not hide the others
                rows.append((label, float("nan")))
                say(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")
            finally:
                M.RelativePositionBias.forward, fast.FlexBias.score_mod = reference
            say(f"pmlm step, {impl}, {rows[-1][0]}: {rows[-1][1]:.1f} ms")
            del s
            if device.type == "cuda":
                torch.cuda.empty_cache()
        # the floor: no relative bias at all
        args.model_overrides = {"rel_pos_buckets": 0}
        s = build_step("pmlm", impl, {}, tok, examples, args, device)
        rows.append((f"{impl}, no relative bias", timed(s["step"], s["batches"], args.warmup, device) * 1000))
        say(f"pmlm step, {rows[-1][0]}: {rows[-1][1]:.1f} ms")
        args.model_overrides = {}
        del s
    say("\n| pmlm step with the relative bias computed as | ms a step |\n|---|---|")
    for label, ms in rows:
        say(f"| {label} | {ms:.1f} |")


# --------------------------------------------------------------------------------------------------
# --part triton: fast/triton_bias.py's Triton attention against SDPA, alone and in a pmlm step


def attention_alone(tok, examples, args, device):
    """One attention call (forward + backward, bf16) on a real pmlm batch's layout: SDPA with the dense
    bias-with-mask needing a gradient (today's path in each layer), SDPA with the boolean mask and no bias (the
    floor), and the Triton kernel with several tile shapes. -> rows (label, ms, relative error of the output)."""
    from fast import triton_bias as FBA
    from objectives import get_objective
    obj = get_objective("pmlm", tok, max_len=M.PRESETS[args.preset]["max_position"])
    b = obj.make_batch(examples[:args.batch], random.Random(0)).to(device)
    cfg = M.ModelConfig(**{**M.PRESETS[args.preset], **obj.model_defaults})
    H, D = cfg.n_head, cfg.n_embd // cfg.n_head
    B, L = b.kind.shape
    holder = torch.nn.Module()
    holder.rel_bias = M.RelativePositionBias(cfg.rel_pos_buckets, cfg.rel_pos_max_distance, H,
                                             cfg.max_position).to(device)
    holder.config = cfg
    inp = FBA.inputs(holder, b.position_ids, b.mask)
    dense = b.mask.dense()
    dense = dense | (torch.eye(L, dtype=torch.bool, device=device) & (b.kind == PAD)[:, :, None])
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device=device, generator=g).to(torch.bfloat16).requires_grad_()
               for _ in range(3))
    do = torch.randn(B, H, L, D, device=device, generator=g).to(torch.bfloat16)
    w = holder.rel_bias.table.weight
    out = {}

    def sdpa_bias(_):
        bias = fast.BucketBias.apply(w, holder.rel_bias.buckets(b.position_ids, b.position_ids), torch.bfloat16)
        bias = bias.masked_fill(~dense[:, None], float("-inf"))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        o.backward(do)
        out["o"] = o.detach()

    def sdpa_plain(_):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=dense[:, None])
        o.backward(do)

    def triton(_):
        o = FBA.attention(q, k, v, inp)
        o.backward(do)
        out["o"] = o.detach()

    rows = []
    reps = [None] * (args.steps + args.warmup)
    rows.append(("sdpa + bias (BucketBias), fwd + bwd", timed(sdpa_bias, reps, args.warmup, device) * 1000, 0.0))
    ref = out["o"].float()
    rows.append(("sdpa, boolean mask, no bias, fwd + bwd", timed(sdpa_plain, reps, args.warmup, device) * 1000,
                 float("nan")))
    default = (FBA.FORWARD, FBA.BACKWARD_KV, FBA.BACKWARD_Q)
    shapes = [default, ((64, 32, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2)),
              ((128, 64, 8, 2), (64, 64, 8, 2), (64, 64, 8, 2)),
              ((128, 32, 8, 3), (32, 128, 8, 3), (128, 32, 8, 3))]
    # every shape with the bias gradient by prefix sums (the default); the default shape also by the loop over
    # buckets (the dQ kernel before)
    runs = [(shape, "prefix") for shape in shapes] + [(default, "loop")]
    for shape, way in runs:
        FBA.FORWARD, FBA.BACKWARD_KV, FBA.BACKWARD_Q = shape
        before = table_gradient(way)
        label = f"triton, tiles fwd {shape[0]} dkdv {shape[1]} dq {shape[2]}, table gradient by {way}, fwd + bwd"
        try:
            ms = timed(triton, reps, args.warmup, device) * 1000
            err = float((out["o"].float() - ref).norm() / ref.norm())
            rows.append((label, ms, err))
        except Exception as e:                      # a shape that does not compile: say so, go on
            say(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")
        finally:
            table_gradient(before)
    FBA.FORWARD, FBA.BACKWARD_KV, FBA.BACKWARD_Q = default
    counts = [int((inp.tiles == st).sum()) for st in (0, 1, 2)]
    say(f"attention alone: B={B}, H={H}, L={L}, D={D}, bf16; 32 x 32 tiles empty / partial / full: {counts}")
    return rows


def triton_part(tok, examples, args, device):
    """The Triton attention alone against SDPA, then whole pmlm steps: sdpa (train.py's default on CUDA), the
    Triton kernel (fast.use_triton_bias), and sdpa without the relative bias (the floor)."""
    from fast import triton_bias  # noqa: F401  (fails here without triton)
    rows = attention_alone(tok, examples, args, device)
    say("\n| attention alone (one layer) | ms | output vs sdpa + bias |\n|---|---|---|")
    for label, ms, err in rows:
        say(f"| {label} | {ms:.2f} | {err:.1e} |")
    steps = []
    # dropout 0.1 as bench_train.py; the Triton kernel has no dropout on the attention weights (as flex), so
    # sdpa + bias also runs with every dropout off
    # triton: how its dQ kernel sums the bias gradient ("prefix", the default; "loop", the kernel before)
    runs = (("sdpa + bias (BucketBias), train.py's default", "sdpa", None, {}),
            ("sdpa + bias (BucketBias), dropout 0", "sdpa", None, {"dropout": 0.0}),
            ("triton (fast/triton_bias.py), no attention dropout", "flex", "prefix", {}),
            ("triton, bias gradient by the loop over buckets (before)", "flex", "loop", {}),
            ("sdpa, no relative bias", "sdpa", None, {"rel_pos_buckets": 0}))
    for label, impl, triton, overrides in runs:
        args.model_overrides = overrides
        before = None
        try:
            s = build_step("pmlm", impl, {}, tok, examples, args, device)
            if triton:
                fast.use_triton_bias(s["model"])
                before = table_gradient(triton)
            steps.append((label, timed(s["step"], s["batches"], args.warmup, device) * 1000))
            del s
        except Exception as e:
            steps.append((label, float("nan")))
            say(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")
        finally:
            if before is not None:
                table_gradient(before)
        say(f"pmlm step, {steps[-1][0]}: {steps[-1][1]:.1f} ms")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    args.model_overrides = {}
    say("\n| pmlm step (compiled blocks, bf16) | ms a step |\n|---|---|")
    for label, ms in steps:
        say(f"| {label} | {ms:.1f} |")


# --------------------------------------------------------------------------------------------------
# --part copy: PALM's additive copy scores (Eq. 3), several ways


def tanh_by_sigmoid(hm, ws, w):
    """Eq. 3 with tanh(x) = 2 sigmoid(2x) - 1 (an exp and a reciprocal instead of libdevice's tanh)."""
    return ((2 * torch.sigmoid(2 * (hm[:, None] + ws[:, :, None])) - 1) * w).sum(-1)


def copy_part(args, device):
    B, T, S, d = (32, 102, 407, 768) if device.type == "cuda" else (2, 8, 30, 16)
    g = torch.Generator(device=device).manual_seed(0)
    # as in training: hm and ws come out of bf16 linear layers, w is an fp32 parameter
    hm, ws = (torch.randn(B, n, d, device=device, generator=g).to(torch.bfloat16).requires_grad_()
              for n in (S, T))
    w = torch.randn(d, device=device, generator=g).requires_grad_()
    cuda = device.type == "cuda"
    ways = {"compiled (fast/)" if cuda else "written out (model.py)":
            fast.compiled_additive_scores() if cuda else M.additive_scores,
            "compiled, max-autotune": torch.compile(M.additive_scores, dynamic=True,
                                                    mode="max-autotune-no-cudagraphs") if cuda else None,
            "tanh as 2 sigmoid(2x) - 1, compiled": torch.compile(tanh_by_sigmoid, dynamic=True) if cuda else None,
            "triton (fast/triton_additive.py)": triton_additive_scores() if cuda else None,
            "triton, tanh.approx (fast/triton_additive.py's TANH)": triton_additive_scores() if cuda else None}
    ref = None
    for label, fn in ways.items():
        if fn is None:
            continue
        out = {}

        def once(_):
            for x in (hm, ws, w):
                x.grad = None
            e = fn(hm, ws, w)
            e.backward(torch.ones_like(e))
            out["e"] = e.detach().float()

        def forward(_):
            with torch.no_grad():
                fn(hm, ws, w)
        # fast/triton_additive.py's way of computing tanh, set for this way's runs only
        tanh = "approx" if "tanh.approx" in label else "exp2"
        before = set_triton_tanh(tanh) if "triton" in label else None
        try:
            ms = timed(once, [None] * 12, 2, device) * 1000
            ms_forward = timed(forward, [None] * 12, 2, device) * 1000
        except Exception as e:
            say(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        finally:
            if before is not None:
                set_triton_tanh(before)
        ref = ref if ref is not None else out["e"]
        err = float((out["e"] - ref).abs().max() / ref.abs().max())
        say(f"copy scores, {label}: {ms:.2f} ms forward + backward, {ms_forward:.2f} ms forward alone "
            f"(B={B}, T={T}, S={S}, d={d}); against the first: {err:.1e}")
    if cuda and ways["triton (fast/triton_additive.py)"] is not None:
        triton_tiles(hm, ws, w, device)


def triton_tiles(hm, ws, w, device):
    """fast/triton_additive.py's op with other tiles (BT, BS, BK, warps), the same for its three kernels: each
    builds for sm_90 without spilling (bench/check_triton_additive.py --build's way, at session 11)."""
    from fast import triton_additive as TA
    default = TA.FORWARD, TA.BACKWARD_WS, TA.BACKWARD_HM
    ops = {"forward + backward": lambda: TA.additive_scores(hm, ws, w).backward(torch.ones(
               hm.size(0), ws.size(1), hm.size(1), device=device)),
           "forward": lambda: TA.additive_scores(hm.detach(), ws.detach(), w.detach())}
    for tiles in [default[0], (32, 64, 8, 8), (64, 64, 4, 8), (32, 32, 8, 4), (16, 16, 32, 4)]:
        TA.FORWARD = TA.BACKWARD_WS = TA.BACKWARD_HM = tiles
        try:
            times = {name: timed(lambda _: op(), [None] * 12, 2, device) * 1000 for name, op in ops.items()}
        except Exception as e:
            say(f"triton copy scores, tiles {tiles} failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        finally:
            TA.FORWARD, TA.BACKWARD_WS, TA.BACKWARD_HM = default
        say(f"copy scores, triton, tiles (BT, BS, BK, warps) {tiles}: " +
            ", ".join(f"{ms:.2f} ms {name}" for name, ms in times.items()))


def set_triton_tanh(way):
    """Set how fast/triton_additive.py computes tanh ("exp2", the default, or "approx") -> the previous way."""
    from fast import triton_additive as TA
    before, TA.TANH = TA.TANH, way
    return before


def triton_additive_scores():
    """fast/triton_additive.py's op, or None without triton."""
    try:
        from fast import triton_additive
    except ImportError as e:
        say(f"triton (fast/triton_additive.py) not importable: {e}")
        return None
    return triton_additive.additive_scores


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["steps", "bias", "copy", "triton"], default="steps")
    ap.add_argument("--only", default="unilm,pmlm,pmlm flex,palm (copy),palm (no copy)")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cache", default=".cache")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--top", type=int, default=15, help="kernels listed a run")
    ap.add_argument("--no_cudnn", action="store_true",
                    help="SDPA never picks cuDNN's attention (the NaN of bench/study_nan.py), for the whole process: "
                    "switched in one process between runs, the compiled blocks kept the backend of the first")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    if args.tiny:
        args.preset, args.seq_len, args.batch, args.vocab, args.steps, args.warmup = "tiny", 64, 4, 1000, 2, 1
    # bench_train.build_step's model settings this script does not vary (blocks compiled for static
    # shapes: build_step's default)
    args.model_overrides = {}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.enable_cudnn_sdp(not args.no_cudnn)
    say(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
        f"preset {args.preset}, batch {args.batch}, text {args.seq_len}, {time.strftime('%Y-%m-%d')}"
        + (", SDPA without cuDNN's attention" if args.no_cudnn else ""))
    tok, examples = corpus(args)
    if args.part == "steps":
        runs = {"unilm": ("unilm", "sdpa", {}), "pmlm": ("pmlm", "sdpa", {}), "pmlm flex": ("pmlm", "flex", {}),
                "palm (copy)": ("palm", "sdpa", {}), "palm (no copy)": ("palm", "sdpa", {"copy": False}),
                "palm (compiled copy)": ("palm", "sdpa", {"copy_scores": "compiled"}),
                "pmlm triton": ("pmlm", "flex", {}), "pmlm triton loop": ("pmlm", "flex", {}),
                "hf": ("hf", "sdpa", {}), "ernie_gen": ("ernie_gen", "sdpa", {})}
        for label in args.only.split(","):
            name, impl, options = runs[label]
            if impl == "flex" and device.type != "cuda":
                continue
            # "pmlm triton loop": the dQ kernel's bias gradient by the loop over buckets (the kernel before)
            triton = ("loop" if label.endswith("loop") else "prefix") if label.startswith("pmlm triton") else None
            try:
                profile_run(name, impl, options, label, tok, examples, args, device, triton=triton)
            except Exception as e:
                say(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    elif args.part == "bias":
        bias_part(tok, examples, args, device)
    elif args.part == "triton":
        triton_part(tok, examples, args, device)
    else:
        copy_part(args, device)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"profile_{args.part}.txt").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()

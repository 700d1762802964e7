"""One layer's attention in a beam-5 decoding step, two cache layouts, every SDPA backend (issue 21 item 6).

    python bench/decode_attention.py          # on a GPU; prints a markdown table, writes $OUT/decode_attention.txt
    python bench/decode_attention.py --tiny   # a CPU smoke run of the same code

A decoding step of bench_generate.py's setting (32 sources of 512 tokens, beam 5, 64 new tokens, base preset: 12
heads of 64) attends, in each of the 12 layers, from the new columns of every beam to the whole static cache
(fast.StaticCache: source, target slots, the query token). The two layouts:
  - one row a beam (fast.StaticCache today): q (B K, H, n, D) against k, v (B K, H, S + T, D): every beam holds
    its own copy of its source's keys and values, so a step reads the source K times;
  - one row a source: q (B, H, K n, D) against k, v (B, H, S + K T, D): the source's slots once, then each beam's
    target slots; the mask lets beam k's queries see the source and beam k's slots only.
Both compute the same attention (checked here against each other, fp32); the table gives the time of one call
(CUDA events, median of --reps) for each SDPA backend that takes the inputs.
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

LINES = []


def say(text):
    print(text, flush=True)
    LINES.append(text)


def layouts(B, K, H, D, S, T, n, filled, device, dtype, g):
    """The same queries, keys, values and mask in both layouts -> (per_beam, per_source), each (q, k, v, mask).
    filled: the target slots written so far (the rest hidden by the mask, as in a static cache)."""
    src_len = torch.randint(S // 2, S + 1, (B,), generator=g)
    src_len[0] = S
    qs = torch.randn(B, K, H, n, D, generator=g)
    k_src, v_src = torch.randn(2, B, H, S, D, generator=g)
    k_tgt, v_tgt = torch.randn(2, B, K, H, T, D, generator=g)
    # one row a beam: the source copied into every beam's row
    seen_src = torch.arange(S)[None] < src_len[:, None]                          # (B, S)
    seen_tgt = (torch.arange(T) < filled).expand(B, T)                           # (B, T)
    beam = (qs.reshape(B * K, H, n, D),
            torch.cat([k_src[:, None].expand(B, K, H, S, D), k_tgt], 3).reshape(B * K, H, S + T, D),
            torch.cat([v_src[:, None].expand(B, K, H, S, D), v_tgt], 3).reshape(B * K, H, S + T, D),
            torch.cat([seen_src, seen_tgt], 1).repeat_interleave(K, 0)[:, None, None].expand(B * K, 1, n, S + T))
    # one row a source: queries of beam k at rows k n .. k n + n - 1; beam k's slots at S + k T ..
    q = qs.permute(0, 2, 1, 3, 4).reshape(B, H, K * n, D)
    k = torch.cat([k_src, k_tgt.permute(0, 2, 1, 3, 4).reshape(B, H, K * T, D)], 2)
    v = torch.cat([v_src, v_tgt.permute(0, 2, 1, 3, 4).reshape(B, H, K * T, D)], 2)
    own = torch.arange(K)[:, None] == torch.arange(K).repeat_interleave(T)[None]  # (K, K T) beam k's slots
    mask = torch.cat([seen_src[:, None].expand(B, K, S),
                      own[None] & seen_tgt.repeat(1, K)[:, None]], 2)             # (B, K, S + K T)
    mask = mask.repeat_interleave(n, 1)[:, None]                                  # (B, 1, K n, S + K T)
    move = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    return tuple(move(t) for t in beam), tuple(move(t) for t in (q, k, v, mask))


def same_attention(beam, source, B, K, H, n, D):
    """The two layouts' outputs in the beam layout, fp32 -> max |difference|."""
    a = F.scaled_dot_product_attention(*beam[:3], attn_mask=beam[3])                 # (B K, H, n, D)
    b = F.scaled_dot_product_attention(*source[:3], attn_mask=source[3])             # (B, H, K n, D)
    b = b.view(B, H, K, n, D).permute(0, 2, 1, 3, 4).reshape(B * K, H, n, D)
    return (a - b).abs().max().item()


def timed(fn, reps, device):
    if device.type != "cuda":
        fn()
        return float("nan")
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


BACKENDS = {"default": None, "cuDNN": SDPBackend.CUDNN_ATTENTION, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--src_len", type=int, default=512)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    B, K, H, D, S, T = args.batch, args.beam, 12, 64, args.src_len, args.new_tokens + 1
    if args.tiny:
        B, K, H, D, S, T = 2, 3, 2, 8, 16, 5
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    say(f"{name}, torch {torch.__version__}, {dtype}; B {B} sources x beam {K}, H {H}, D {D}, source {S}, "
        f"target slots {T}; one layer's attention, ms (median of {args.reps})")
    g = torch.Generator().manual_seed(0)
    say("| new columns a beam | target slots filled | layout | " + " | ".join(BACKENDS) + " | fp32 max diff |")
    say("|---|---|---|" + "---|" * len(BACKENDS) + "---|")
    for n in (1, 2):                       # unilm, palm: [y_{t-1}]; pmlm, ernie_gen: [y_{t-1}, query]
        for filled in (1, T // 2, T):
            beam32, source32 = layouts(B, K, H, D, S, T, n, filled, device, torch.float32, g)
            diff = same_attention(beam32, source32, B, K, H, n, D)
            beam, source = (tuple(t.to(dtype) if t.is_floating_point() else t for t in x) for x in (beam32, source32))
            for label, inputs in (("one row a beam", beam), ("one row a source", source)):
                cells = []
                for backend in BACKENDS.values():
                    fn = lambda: F.scaled_dot_product_attention(*inputs[:3], attn_mask=inputs[3])
                    try:
                        if backend is None:
                            cells.append(f"{timed(fn, args.reps, device):.3f}")
                        else:
                            with sdpa_kernel(backend):
                                cells.append(f"{timed(fn, args.reps, device):.3f}")
                    except RuntimeError as e:
                        cells.append("-" if "No available kernel" in str(e) or "No viable backend" in str(e)
                                     else f"error: {str(e)[:40]}")
                say(f"| {n} | {filled} | {label} | " + " | ".join(cells) + f" | {diff:.1e} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "decode_attention.txt").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""fast/triton_additive.py (PALM's copy scores, Eq. 3, in Triton) against model.additive_scores.

    python bench/check_triton_additive.py          # a CPU: Triton's interpreter (TRITON_INTERPRET=1)
    python bench/check_triton_additive.py --build  # no GPU needed: build for sm_90, report spills

Needs triton (pip install triton; not a requirement of the project). Checks:
  - the scores and the gradients of hm, ws and w against model.additive_scores in float64, at small
    shapes, some not multiples of the tiles (fp32 inputs: 1e-5; bf16 hm and ws: the same bf16
    values in float64, 1e-2, with model.additive_scores on the bf16 inputs beside it for scale);
  - large |hm + ws| (tanh at +-1, exp2 overflowing): finite, and equal to the reference;
  - PALM's loss and every gradient through a small model with fast.use_triton_additive on and off
    (fp32), the copy scores at once and in checkpointed chunks (palm's copy_chunk).
On a GPU (bench/check_cuda.py calls check()) also the base shape (B 8, S 400, T 100, d 768), and
fast/triton_additive.py's TANH "approx" (tanh.approx.f32) on bf16 inputs.
Prints a table; exits 1 if a check fails, 2 without triton.
"""
import argparse
import os
import random
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available() and "--build" not in sys.argv:
    # before triton is imported: the kernels with numpy on the CPU; --build wants the compiler
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M                                          # noqa: E402
from objectives import get_objective                       # noqa: E402


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def scores_and_grads(fn, hm, ws, w, g):
    """fn(hm, ws, w) -> [e, d hm, d ws, d w] for the upstream gradient g."""
    hm, ws, w = (x.detach().requires_grad_() for x in (hm, ws, w))
    e = fn(hm, ws, w)
    grads = torch.autograd.grad(e, (hm, ws, w), g.to(e.dtype))
    return [e.detach()] + list(grads)


def compare(label, B, T, S, d, dev, rows, scale=1.0, seed=0,
            limits=((torch.float32, 1e-5), (torch.bfloat16, 1e-2))):
    """The kernel against model.additive_scores in float64 on (B, T, S, d): fp32 and bf16 inputs
    (w fp32, as the parameter in training). scale: the size of hm and ws (large: tanh saturates).
    limits: (dtype of hm and ws, largest relative error) of each run."""
    from fast import triton_additive as TA
    g_ = torch.Generator().manual_seed(seed)
    x = [torch.randn(*shape, generator=g_) for shape in ((B, S, d), (B, T, d), (d,), (B, T, S))]
    hm, ws, w, g = (t.to(dev) for t in x)
    hm, ws = hm * scale, ws * scale
    ok = True
    for dtype, limit in limits:
        hm_, ws_ = hm.to(dtype), ws.to(dtype)
        # the reference on the very values the kernel reads, in float64
        want = scores_and_grads(M.additive_scores, hm_.double(), ws_.double(), w.double(),
                                g.double())
        got = scores_and_grads(TA.additive_scores, hm_, ws_, w, g)
        if dtype == torch.bfloat16:
            ref16 = scores_and_grads(M.additive_scores, hm_, ws_, w, g)
        for i, name in enumerate(("e", "d hm", "d ws", "d w")):
            err = rel(got[i], want[i])
            # the scores fp32, each gradient in its input's dtype
            dtype_ok = got[i].dtype == (torch.float32, hm_.dtype, ws_.dtype, w.dtype)[i]
            good = err < limit and bool(torch.isfinite(got[i]).all()) and dtype_ok
            ok &= good
            note = "" if dtype_ok else f" (dtype {got[i].dtype})"
            if dtype == torch.bfloat16:
                note += f" (model.additive_scores in bf16: {rel(ref16[i], want[i]):.1e})"
            rows.append((label, f"{name}, hm/ws {str(dtype)[6:]}", f"{err:.2e}{note}", good))
    return ok


def check_model(dev, rows):
    """PALM's loss and every parameter's gradient with fast.use_triton_additive on and off (fp32,
    a small model, the copy head chunked and checkpointed as in training where palm does)."""
    import fast
    from bench.bench_generate import synthetic_tokenizer
    from bench.bench_train import passages
    tok = synthetic_tokenizer(200)
    obj = get_objective("palm", tok, max_len=512)
    obj.set_step(10, 10)                                   # stage 2: the copy head at work
    cfg = M.ModelConfig(vocab_size=len(tok), n_layer=2, n_head=2, n_embd=64, ffn_dim=128,
                        dropout=0.0, **obj.model_defaults)
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(dev)
    b = obj.make_batch(passages(2, 60, len(tok), random.Random(1)), random.Random(1)).to(dev)
    ok = True
    # copy_chunk 5: the scores 5 steps at a time, checkpointed (the op runs again in backward)
    for chunk in (0, 5):
        obj.copy_chunk = chunk
        outs = []
        for triton in (False, True):
            fast.use_triton_additive(model, triton)
            model.zero_grad(set_to_none=True)
            loss, _ = obj.loss(model, b)
            loss.backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            outs.append((loss.detach(), grads))
        err = max(rel(outs[1][0], outs[0][0]), rel(outs[1][1], outs[0][1]))
        good = err < 1e-5
        ok &= good
        rows.append(("palm model", f"copy_chunk {chunk}: triton vs readable copy scores, loss and "
                     "every gradient, fp32", f"{err:.2e}", good))
    return ok


def check_build(rows):
    """Build the three kernels for an H100 (sm_90) without one, with triton's own ptxas. Reports
    each kernel's registers and stack bytes a thread (0: everything in registers)."""
    from bench.check_triton import build_sm90
    from fast import triton_additive as TA
    ok = True
    for dtype, tanh in (("bf16", "exp2"), ("fp32", "exp2"), ("bf16", "approx")):
        for fn, shape in ((TA._additive_forward, TA.FORWARD),
                          (TA._additive_backward_ws, TA.BACKWARD_WS),
                          (TA._additive_backward_hm, TA.BACKWARD_HM)):
            BT, BS, BK, warps = shape
            consts = dict(BT=BT, BS=BS, BK=BK, TANH=tanh)
            signature = {}
            for name in fn.arg_names:
                if name in consts:
                    signature[name] = "constexpr"
                elif name in ("HM", "WS", "DHM", "DWS"):
                    signature[name] = "*" + dtype
                elif name in ("G", "W", "E", "DW_PARTS"):
                    signature[name] = "*fp32"
                else:
                    signature[name] = "i32"
            label = f"{fn.__name__}, hm/ws {dtype}, tiles {shape}, tanh by {tanh}"
            try:
                kernel, regs, stack = build_sm90(fn, signature, consts, "triton_additive.cubin",
                                                 num_warps=warps)
                ptx = kernel.asm["ptx"]
                # the special-function instructions, and the shuffles of sums across threads
                counts = ", ".join(f"{ptx.count(op)} {op.split('.')[0]}"
                                   for op in ("ex2.approx", "tanh.approx", "shfl.sync"))
                rows.append(("build, sm_90", label, f"{regs}, {stack}, shared "
                             f"{kernel.metadata.shared} B; in the PTX {counts}", True))
            except Exception as e:
                ok = False
                # a compilation error's own line (the rest points at the source)
                lines = str(e).strip().splitlines()
                why = next((x for x in lines if "Error" in x), lines[-1])[:200]
                rows.append(("build, sm_90", label, f"{type(e).__name__}: {why}", False))
    return ok


def check(dev, base=False):
    """Every check on device dev -> (rows, ok)."""
    rows, ok = [], True
    shapes = [(2, 7, 13, 40), (1, 33, 70, 17), (3, 32, 32, 16), (2, 5, 41, 64)]
    for B, T, S, d in shapes:
        ok &= compare(f"B {B}, T {T}, S {S}, d {d}", B, T, S, d, dev, rows)
    ok &= compare("large |x|: hm, ws x 100", 2, 7, 13, 40, dev, rows, scale=100.0)
    if base:
        ok &= compare("base: B 8, T 100, S 400, d 768", 8, 100, 400, 768, dev, rows)
    if dev.type == "cuda":
        # TA.TANH "approx" (tanh.approx.f32, a GPU instruction): bf16 inputs only, as in training
        from fast import triton_additive as TA
        default, TA.TANH = TA.TANH, "approx"
        try:
            for B, T, S, d in [(2, 7, 13, 40), (8, 100, 400, 768)]:
                ok &= compare(f"tanh.approx: B {B}, T {T}, S {S}, d {d}", B, T, S, d, dev, rows,
                              limits=((torch.bfloat16, 1e-2),))
        finally:
            TA.TANH = default
    ok &= check_model(dev, rows)
    return rows, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true",
                    help="only build the kernels for sm_90 (no GPU needed) and report their spills")
    args = ap.parse_args()
    try:
        import triton
    except ImportError:
        print("check_triton_additive.py: error: triton is not installed (pip install triton)",
              file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.build:
        os.environ.pop("TRITON_INTERPRET", None)
        rows = []
        ok = check_build(rows)
        where = "cpu, built for sm_90 with triton's ptxas"
    else:
        rows, ok = check(dev, base=dev.type == "cuda")
        where = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu, Triton's interpreter"
    print(f"\n{where}, torch {torch.__version__}, triton {triton.__version__}")
    print("| shape | check | result (relative error) | |\n|---|---|---|---|")
    for label, what, value, good in rows:
        print(f"| {label} | {what} | {value} | {'ok' if good else 'FAIL'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""The optional Triton kernels of fast/ against the readable path, on a GPU or under Triton's CPU interpreter.

    python bench/check_triton.py                 # both kernels; a CPU: Triton's interpreter (TRITON_INTERPRET=1)
    python bench/check_triton.py bias --base     # the attention only; also at base size (slow without a GPU)
    python bench/check_triton.py additive        # PALM's copy scores only
    python bench/check_triton.py --build         # no GPU needed: build the kernels for sm_90, report spills

Needs triton (pip install triton; not a requirement of the project). bench/check_cuda.py runs check() and
check_additive() on a GPU. Prints a table; exits 1 if a check fails, 2 without triton.

bias: fast/triton_bias.py (the attention with UniLMv2's relative bias and the mask rule inside the tiles), each
check against model.naive_attention with Transformer.encode's dense mask (masks.attention_mask, padding queries
seeing themselves) and bias (RelativePositionBias, -inf where the mask says no):
  - the output and the gradients of q, k, v and the bias table, fp32 (against float64) and bf16 (the kernel on
    bf16 inputs against the naive path in fp32 on the same inputs, the naive path in bf16 beside it for scale),
    on UniLMv2's and ERNIE-GEN's real pre-training layouts, random kinds with padding, and packed rows; dQ and the
    table's gradient with each way the dQ kernel sums it by bucket (FBA.TABLE_GRADIENT: prefix sums where a key
    tile's positions are consecutive, the loop over buckets), and once with buckets that are not runs of distances;
  - that fully masked tiles are skipped: NaN in the keys and values only such tiles hold leaves the rest finite;
  - packed rows (fast.plan_packing) and the whole pmlm model (2 layers; --base: the base preset too) through
    fast.use_triton_bias against the naive path: loss, final states and every gradient (fp32); on a GPU also the
    final states under bf16 autocast and with compiled blocks against eager ones.
additive: fast/triton_additive.py (PALM's copy scores, Eq. 3) against model.additive_scores:
  - the scores and the gradients of hm, ws and w in float64, at shapes some of which are not multiples of the
    tiles (fp32 inputs: 1e-5; bf16 hm and ws: 1e-2, model.additive_scores in bf16 beside it for scale); --base
    also B 8, S 400, T 100, d 768; on a GPU also TANH "approx" (tanh.approx.f32) on bf16 inputs;
  - large |hm + ws| (tanh at +-1, exp2 overflowing): finite, and equal to the reference;
  - PALM's loss and every gradient through a small model with fast.use_triton_additive on and off (fp32), the
    copy scores at once and in checkpointed chunks (palm's copy_chunk).
"""
import argparse
import copy
import os
import random
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available() and "--build" not in sys.argv:
    # before triton is imported (newer Triton fixes the mode at import): the kernels with numpy on the CPU;
    # --build wants the compiler
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M                                          # noqa: E402
from objectives import get_objective                       # noqa: E402
from objectives import masks                               # noqa: E402


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# --------------------------------------------------------------------------------------------------
# bias: fast/triton_bias.py

TILE_NOTE = "32 x 32 tiles empty / partial / full"


def dense_reference(rel_bias, pos, kind, step, passage):
    """Transformer.encode's mask and bias: (B, L, L) bool and (B, H, L, L) fp32."""
    allowed = masks.attention_mask(kind, step)
    if passage is not None:
        allowed = allowed & (passage[:, :, None] == passage[:, None, :])
    L = kind.size(1)
    allowed = allowed | (torch.eye(L, dtype=torch.bool, device=kind.device)
                         & (kind == masks.PAD)[:, :, None])
    bias = rel_bias(pos, pos).masked_fill(~allowed[:, None], float("-inf"))
    return allowed, bias


def inputs_for(rel_bias, pos, kind, step, passage):
    from fast import triton_bias as FBA
    holder = torch.nn.Module()
    holder.rel_bias = rel_bias
    return FBA.inputs(holder, pos, masks.MaskSpec(kind, step, passage))


def run(fn, q, k, v, table, g):
    """fn(q, k, v) -> output and the gradients of q, k, v and table for the upstream gradient g."""
    for t in (q, k, v, table):
        t.grad = None
    o = fn(q, k, v)
    o.backward(g.to(o.dtype))
    return [o.detach()] + [t.grad.detach().clone() for t in (q, k, v, table)]


def prefix_tiles(allowed, pos):
    """How _backward_q's key tiles sum the bias gradient on this layout: (tiles it visits, those
    whose keys hold consecutive positions: by prefix sums, the rest bucket by bucket)."""
    from fast import triton_bias as FBA
    BM, BN = FBA.BACKWARD_Q[:2]
    B, L, _ = allowed.shape
    visited = consecutive = 0
    for b in range(B):
        # position - index: one value along a run of consecutive positions
        run = pos[b] - torch.arange(L, device=pos.device)
        for n in range(0, L, BN):
            seen = sum(bool(allowed[b, m:m + BM, n:n + BN].any()) for m in range(0, L, BM))
            visited += seen
            consecutive += seen * bool((run[n:n + BN] == run[n]).all())
    return visited, consecutive


def compare(label, layout, dev, H, D, rows, seed=0, scattered=False):
    """The kernel against the naive path on one layout (pos, kind, step, passage), fp32 and bf16;
    dQ and the table's gradient with each way of summing it by bucket (FBA.TABLE_GRADIENT).
    scattered: buckets that are not runs of distances (every tile then sums bucket by bucket)."""
    from fast import triton_bias as FBA
    pos, kind, step, passage = (t.to(dev) if t is not None else None for t in layout)
    B, L = kind.shape
    torch.manual_seed(seed)
    rel_bias = M.RelativePositionBias(32, 128, H, 512).to(dev)
    if scattered:
        distance = torch.arange(rel_bias.distance_bucket.numel(), device=dev) - rel_bias.offset
        rel_bias.distance_bucket = (distance.abs() * 7) % 32
    with torch.no_grad():
        rel_bias.table.weight.normal_(0, 1.0)              # a bias that matters next to q k^T
    table = rel_bias.table.weight
    allowed, _ = dense_reference(rel_bias, pos, kind, step, passage)
    inp = inputs_for(rel_bias, pos, kind, step, passage)
    counts = "/".join(str(int((inp.tiles == s).sum())) for s in (0, 1, 2))
    rows.append((label, f"B {B}, L {L}: {TILE_NOTE}", counts, True))
    visited, consecutive = prefix_tiles(allowed, pos)
    runs = bool(inp.bucket_bounds[2].all())
    rows.append((label, "dQ key tiles visited / with consecutive positions (by prefix sums)"
                 + ("" if runs else "; buckets not runs: none by prefix sums"),
                 f"{visited} / {consecutive if runs else 0}", True))
    x = torch.randn(3, B, H, L, D, device=dev)
    g = torch.randn(B, H, L, D, device=dev)
    real = (kind != masks.PAD)[:, None, :, None]
    ok = True
    for dtype, limit in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q, k, v = (t.to(dtype).float().requires_grad_() for t in x)
        # the bias made inside, so the table gets its gradient; in the inputs' dtype, as encode
        naive = lambda q, k, v: M.naive_attention(
            q, k, v, allowed,
            rel_bias(pos, pos).masked_fill(~allowed[:, None], float("-inf")).to(q.dtype))
        if dtype == torch.float32:
            # the reference in float64: what is left is the kernel's own rounding, not the naive
            # path's (a bucket's gradient sums some 10^5 terms; two fp32 orders differ by ~1e-5)
            bias64 = copy.deepcopy(rel_bias).double()
            naive64 = lambda q, k, v: M.naive_attention(
                q, k, v, allowed, bias64(pos, pos).masked_fill(~allowed[:, None], float("-inf")))
            want = run(naive64, *(t.detach().double().requires_grad_() for t in (q, k, v)),
                       bias64.table.weight, g.double())
            want = [w.float() for w in want]
        else:
            want = run(naive, q, k, v, table, g)
        qd, kd, vd = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        want[0] = want[0] * real
        if dtype == torch.bfloat16:
            ref16 = run(naive, qd, kd, vd, table, g)
            ref16[0] = ref16[0] * real
        default = FBA.TABLE_GRADIENT
        for way in ("prefix", "loop"):
            FBA.TABLE_GRADIENT = way
            try:
                got = run(lambda q, k, v: FBA.attention(q, k, v, inp), qd, kd, vd, table, g)
            finally:
                FBA.TABLE_GRADIENT = default
            # padding rows: any finite output will do (they carry no loss); compare the real ones
            got[0] = got[0] * real
            for i, name in enumerate(("out", "dq", "dk", "dv", "dtable")):
                # the other way changes dQ and the table's gradient only
                if way == "loop" and name not in ("dq", "dtable"):
                    continue
                err = rel(got[i], want[i])
                good = err < limit and bool(torch.isfinite(got[i]).all())
                ok &= good
                scale = ""
                if dtype == torch.bfloat16:
                    scale = f" (naive in bf16: {rel(ref16[i], want[i]):.1e})"
                what = f"{name}, {str(dtype)[6:]}"
                if name in ("dq", "dtable"):
                    what += f", table gradient by {way}"
                rows.append((label, what, f"{err:.2e}{scale}", good))
    return ok


# --------------------------------------------------------------------------------------------------
# Layouts: (pos, kind, step, passage), each (B, L)


def objective_layout(name, B, text, seed=0):
    """A real pre-training batch's position ids, kinds and steps."""
    from bench.bench_generate import synthetic_tokenizer
    from bench.bench_train import passages
    tok = synthetic_tokenizer(200)
    obj = get_objective(name, tok, max_len=512)
    obj.set_step(10, 10)
    batch = obj.make_batch(passages(B, text, len(tok), random.Random(seed)), random.Random(seed))
    return batch.position_ids, batch.kind, batch.step, None


def random_layout(B, L, seed=0):
    """Random kinds (every one, padding at the row ends) and steps, shuffled positions."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.randint(1, 5, (B, L), generator=g)
    step = torch.randint(0, 6, (B, L), generator=g)
    for b in range(B):
        kind[b, L - 7 * (b + 1):] = masks.PAD
    pos = torch.stack([torch.randperm(L, generator=g) for _ in range(B)])
    return pos, kind, step, None


def packed_layout(B, L, seed=0):
    """Rows of several passages (positions restarting at each), pmlm-like kinds."""
    g = torch.Generator().manual_seed(seed)
    pos, kind, step, passage = (torch.zeros(B, L, dtype=torch.long) for _ in range(4))
    for b in range(B):
        start, p = 0, 0
        while start < L - 8:
            n = int(torch.randint(8, 48, (1,), generator=g))
            n = min(n, L - start - 3)
            pos[b, start:start + n] = torch.arange(n)
            kind[b, start:start + n] = masks.CTX
            # the last quarter: appended originals and [P]s of two steps
            tail = n // 4
            kind[b, start + n - tail:start + n] = torch.where(torch.arange(tail) % 2 == 0,
                                                              masks.ORIG, masks.PSEUDO)
            step[b, start + n - tail:start + n] = 1 + torch.arange(tail) // (tail // 2 + 1)
            passage[b, start:start + n] = p
            start, p = start + n, p + 1
    return pos, kind, step, passage


def check_skipping(dev, rows):
    """NaN in the keys and values of a part no query of the first tile may see: the tile is skipped,
    so the first tile's output and dQ stay finite (any product with NaN would spread it)."""
    from fast import triton_bias as FBA
    L = 256
    kind = torch.full((1, L), masks.CTX)
    kind[0, 128:] = masks.ORIG                          # CTX never sees ORIG: tiles (0, 1) empty
    step = torch.zeros(1, L, dtype=torch.long)
    step[0, 128:] = torch.arange(1, 129)
    pos = torch.cat([torch.arange(128), torch.arange(128)])[None]
    rel_bias = M.RelativePositionBias(32, 128, 2, 512).to(dev)
    inp = inputs_for(rel_bias, pos.to(dev), kind.to(dev), step.to(dev), None)
    q, k, v = (torch.randn(1, 2, L, 32, device=dev) for _ in range(3))
    k[:, :, 128:] = float("nan")
    v[:, :, 128:] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = FBA.attention(q, k, v, inp)
    o[:, :, :128].sum().backward()
    good = bool(torch.isfinite(o[:, :, :128]).all() and torch.isfinite(q.grad[:, :, :128]).all())
    rows.append(("skipping", "NaN keys behind empty tiles: output and dQ of the rest finite",
                 "finite" if good else "NaN", good))
    return good


def check_model(dev, rows, preset=None, text=60, batch=2):
    """The pmlm model through fast.use_triton_bias against the naive path: final states and every
    gradient in fp32; on CUDA also final states under bf16 autocast, and compiled blocks
    (fast.compile_blocks, as train.py) against the eager ones."""
    import fast
    from bench.bench_generate import synthetic_tokenizer
    from bench.bench_train import passages
    tok = synthetic_tokenizer(200)
    obj = get_objective("pmlm", tok, max_len=512)
    obj.set_step(10, 10)
    shape = M.PRESETS[preset] if preset else dict(n_layer=2, n_head=2, n_embd=64, ffn_dim=256)
    cfg = M.ModelConfig(**{**shape, "vocab_size": len(tok), "dropout": 0.0, **obj.model_defaults})
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(dev)
    examples = passages(batch, text, len(tok), random.Random(1))
    b = obj.make_batch(examples, random.Random(1)).to(dev)
    real = b.kind != masks.PAD
    label = f"pmlm model{', ' + preset if preset else ''}"

    def final(triton, dtype=torch.float32):
        model.config.attn_impl = "naive"
        fast.use_triton_bias(model, triton)
        with torch.no_grad(), torch.autocast(dev.type, dtype=dtype,
                                             enabled=dtype != torch.float32):
            return model(b.input_ids, b.position_ids, b.segment_ids, b.mask)[real].float()

    def grads(triton):
        model.config.attn_impl = "naive"
        fast.use_triton_bias(model, triton)
        model.zero_grad(set_to_none=True)
        loss, _ = obj.loss(model, b)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    checks = [("triton vs naive, final states, fp32", final(True), final(False), 1e-4),
              ("triton vs naive, every gradient, fp32", grads(True), grads(False), 1e-4)]
    if dev.type == "cuda":
        bf16 = torch.bfloat16
        checks.append(("triton vs naive, final states, bf16", final(True, bf16),
                       final(False, bf16), 2e-2))
        eager = final(True, bf16)
        fast.compile_blocks(model)
        checks.append(("triton, compiled blocks vs eager, bf16", final(True, bf16), eager, 2e-2))
    ok = True
    for name, a, want, limit in checks:
        err = rel(a, want)
        ok &= err < limit
        rows.append((label, name, f"{err:.2e}", err < limit))
    return ok


def check_packed_model(dev, rows):
    """Packed rows (fast.plan_packing: several passages a row) through fast.use_triton_bias against
    the naive path on the same packed rows: the pmlm loss and every gradient (fp32)."""
    import fast
    from bench.bench_generate import synthetic_tokenizer
    from bench.bench_train import passages
    tok = synthetic_tokenizer(200)
    obj = get_objective("pmlm", tok, max_len=512)
    obj.set_step(10, 10)
    cfg = M.ModelConfig(vocab_size=len(tok), n_layer=2, n_head=2, n_embd=64, ffn_dim=128,
                        dropout=0.0, **obj.model_defaults)
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(dev)
    examples = [p for n in (30, 60, 20, 45) for p in passages(1, n, len(tok), random.Random(n))]
    b = fast.plan_packing(obj.make_batch(examples, random.Random(1))).to(dev)
    outs = []
    for triton in (False, True):
        model.config.attn_impl = "naive"
        fast.use_triton_bias(model, triton)
        model.zero_grad(set_to_none=True)
        loss, _ = obj.loss(fast.packed(model, b), b)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        outs.append((loss.detach(), grads))
    err = max(rel(outs[1][0], outs[0][0]), rel(outs[1][1], outs[0][1]))
    rows.append(("packed pmlm model", f"{len(examples)} passages in {b.extras['pack_shape'][0]} "
                 "rows: triton vs naive, loss and every gradient, fp32", f"{err:.2e}", err < 1e-4))
    return err < 1e-4


def build_sm90(fn, signature, consts, cubin_name, **options):
    """Compile a Triton kernel for an H100 (sm_90) without one, with triton's own ptxas, -> (kernel,
    "REG:n", "STACK:n"): its registers and stack bytes a thread, read by cuobjdump from the cubin."""
    import subprocess
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernel = triton.compile(ASTSource(fn, signature, constexprs=consts),
                            target=GPUTarget("cuda", 90, 32), options=options)
    cubin = Path(os.environ.get("TMPDIR", "/tmp"), cubin_name)
    cubin.write_bytes(kernel.asm["cubin"])
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)],
                           capture_output=True, text=True).stdout
    words = usage.replace(",", " ").split()
    regs = next(w for w in words if w.startswith("REG:"))
    stack = next(w for w in words if w.startswith("STACK:"))
    return kernel, regs, stack


def check_build(rows):
    """Build the three kernels for an H100 (sm_90) without one, with triton's own ptxas: what the
    interpreter lets through and the compiler does not (a rule-of-Triton error, a spill). Reports
    each kernel's stack bytes a thread (0: everything in registers) and shared memory."""
    from fast import triton_bias as FBA
    pointers = dict(LSE="fp32", DELTA="fp32", BIAS="fp32", DTABLE="fp32", TILES="i8")
    ints = {"H", "L", "n_tiles", "n_dist", "offset"}
    ok = True
    for dtype, prec in (("bf16", "tf32"), ("fp32", "ieee")):
        # _backward_q with each way of summing the bias gradient by bucket (FBA.TABLE_GRADIENT)
        for fn, shape, extra in ((FBA._forward, FBA.FORWARD, {}),
                                 (FBA._backward_kv, FBA.BACKWARD_KV, {}),
                                 (FBA._backward_q, FBA.BACKWARD_Q, {"NB": 32, "TABLE": "prefix"}),
                                 (FBA._backward_q, FBA.BACKWARD_Q, {"NB": 32, "TABLE": "loop"})):
            BM, BN, warps, stages = shape
            consts = dict(BM=BM, BN=BN, D=64, TILE=FBA.TILE, PREC=prec, **extra)
            signature = {}
            for name in fn.arg_names:
                if name in consts:
                    signature[name] = "constexpr"
                elif name in ("scale", "scale2"):
                    signature[name] = "fp32"
                elif name in ints or (name[0] == "s" and "_" in name):
                    signature[name] = "i32"
                elif name in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV"):
                    signature[name] = "*" + dtype
                else:
                    signature[name] = "*" + pointers.get(name, "i32")
            label = f"{fn.__name__}, {dtype}, tiles {shape}"
            if "TABLE" in extra:
                label += f", table gradient by {extra['TABLE']}"
            try:
                kernel, regs, stack = build_sm90(fn, signature, consts, "triton_bias.cubin",
                                                 num_warps=warps, num_stages=stages)
                wgmma = kernel.asm["ptx"].count("wgmma.mma_async")
                rows.append(("build, sm_90", label, f"{regs}, {stack}, shared "
                             f"{kernel.metadata.shared} B, {wgmma} wgmma", True))
            except Exception as e:
                ok = False
                # a compilation error's last line names the error
                why = str(e).strip().splitlines()[-1][:200]
                rows.append(("build, sm_90", label, f"{type(e).__name__}: {why}", False))
    return ok


def check(dev, base=False):
    """Every check of fast/triton_bias.py on device dev -> (rows, ok)."""
    rows, ok = [], True
    small = [("pmlm batch", objective_layout("pmlm", 2, 150)),
             ("ernie_gen batch", objective_layout("ernie_gen", 2, 50)),
             ("random kinds", random_layout(2, 83)),
             ("packed rows", packed_layout(2, 230))]
    for label, layout in small:
        ok &= compare(label, layout, dev, H=2, D=32, rows=rows)
    ok &= compare("pmlm batch, buckets not runs of distances", objective_layout("pmlm", 1, 100),
                  dev, H=2, D=32, rows=rows, scattered=True)
    if base:
        ok &= compare("pmlm batch, base size", objective_layout("pmlm", 8, 509), dev, H=12, D=64,
                      rows=rows)
    ok &= check_skipping(dev, rows)
    ok &= check_model(dev, rows)
    ok &= check_packed_model(dev, rows)
    if base:
        ok &= check_model(dev, rows, preset="base", text=509, batch=4)
    return rows, ok


# --------------------------------------------------------------------------------------------------
# additive: fast/triton_additive.py

def scores_and_grads(fn, hm, ws, w, g):
    """fn(hm, ws, w) -> [e, d hm, d ws, d w] for the upstream gradient g."""
    hm, ws, w = (x.detach().requires_grad_() for x in (hm, ws, w))
    e = fn(hm, ws, w)
    grads = torch.autograd.grad(e, (hm, ws, w), g.to(e.dtype))
    return [e.detach()] + list(grads)


def compare_additive(label, B, T, S, d, dev, rows, scale=1.0, seed=0,
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


def check_palm_model(dev, rows):
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


def check_build_additive(rows):
    """Build the three kernels for an H100 (sm_90) without one, with triton's own ptxas. Reports
    each kernel's registers and stack bytes a thread (0: everything in registers)."""
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


def check_additive(dev, base=False):
    """Every check of fast/triton_additive.py on device dev -> (rows, ok)."""
    rows, ok = [], True
    shapes = [(2, 7, 13, 40), (1, 33, 70, 17), (3, 32, 32, 16), (2, 5, 41, 64)]
    for B, T, S, d in shapes:
        ok &= compare_additive(f"B {B}, T {T}, S {S}, d {d}", B, T, S, d, dev, rows)
    ok &= compare_additive("large |x|: hm, ws x 100", 2, 7, 13, 40, dev, rows, scale=100.0)
    if base:
        ok &= compare_additive("base: B 8, T 100, S 400, d 768", 8, 100, 400, 768, dev, rows)
    if dev.type == "cuda":
        # TA.TANH "approx" (tanh.approx.f32, a GPU instruction): bf16 inputs only, as in training
        from fast import triton_additive as TA
        default, TA.TANH = TA.TANH, "approx"
        try:
            for B, T, S, d in [(2, 7, 13, 40), (8, 100, 400, 768)]:
                ok &= compare_additive(f"tanh.approx: B {B}, T {T}, S {S}, d {d}", B, T, S, d, dev, rows,
                              limits=((torch.bfloat16, 1e-2),))
        finally:
            TA.TANH = default
    ok &= check_palm_model(dev, rows)
    return rows, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernel", nargs="?", choices=("bias", "additive"), help="one kernel's checks (default: both)")
    ap.add_argument("--base", action="store_true", help="also base size (slow without a GPU)")
    ap.add_argument("--build", action="store_true",
                    help="only build the kernels for sm_90 (no GPU needed) and report their spills")
    args = ap.parse_args()
    try:
        import triton
    except ImportError:
        print("check_triton.py: error: triton is not installed (pip install triton)", file=sys.stderr)
        sys.exit(2)
    kernels = [args.kernel] if args.kernel else ["bias", "additive"]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows, ok = [], True
    if args.build:
        # the compiler, not the interpreter
        os.environ.pop("TRITON_INTERPRET", None)
        for kernel in kernels:
            ok &= (check_build if kernel == "bias" else check_build_additive)(rows)
        where = "cpu, built for sm_90 with triton's ptxas"
    else:
        for kernel in kernels:
            found, good = (check if kernel == "bias" else check_additive)(dev, args.base)
            rows += [(f"{kernel}: {label}", what, value, passed) for label, what, value, passed in found]
            ok &= good
        where = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu, Triton's interpreter"
    print(f"\n{where}, torch {torch.__version__}, triton {triton.__version__}")
    print("| layout or shape | check | result (relative error) | |\n|---|---|---|---|")
    for label, what, value, good in rows:
        print(f"| {label} | {what} | {value} | {'ok' if good else 'FAIL'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

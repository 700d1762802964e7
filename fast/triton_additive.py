"""PALM's additive copy scores (Eq. 3), tiled like a matrix product, in Triton.

The GPU speed layer's kernel for PALM's copy head (fast/ reaches it through one switch,
fast.use_triton_additive(model)). It equals the readable model.additive_scores,

    e[b, t, j] = sum_k w[k] * tanh(hm[b, j, k] + ws[b, t, k])     hm (B, S, d), ws (B, T, d), w (d,)

in values and in the gradients of hm, ws and w (bench/check_triton.py additive: on a CPU through
Triton's interpreter, TRITON_INTERPRET=1, against float64; bench/check_cuda.py on a GPU at base
size, fp32 and bf16 inputs). Why a kernel: the compiled function (fast.compiled_additive_scores)
reads the d-vectors of hm and ws once per (t, j) pair, some 4 GB a step at PALM's training shape;
a tile of BT x BS scores reads its BT + BS vectors once, in chunks of BK (as a matrix product
reads its operands), so the tanh itself sets the pace.

What happens inside (the (B, T, S, d) tensor is never written; backward recomputes the tanh):
  - forward: one program per (b, T tile, S tile), over d in chunks of BK:
        x = ws[t, None, :] + hm[None, j, :]   (BT, BS, BK);  acc += w[k] * tanh(x)
    and e = sum_k acc once at the end (a sum across threads, kept out of the loop);
  - backward, with g = dL/de (B, T, S) and u = tanh(x):
        du[b, t, j, k] = g[b, t, j] * w[k] * (1 - u^2)
        d ws[b, t, k] = sum_j du       one program per (b, T tile, K chunk), over the S tiles
        d hm[b, j, k] = sum_t du       one program per (b, S tile, K chunk), over the T tiles
        d w[k] = sum_{b, t, j} g * u   a partial sum per program of the first, summed once
                                       afterwards (no atomic adds)
    each tile laid out with the axis it sums over first: that sum stays within a thread;
  - tanh(x) = 1 - 2 / (exp2(2 x log2(e)) + 1): +1 for large x (exp2 overflows to inf), -1 for
    large -x (exp2 underflows to 0), never NaN; exp2, which the interpreter runs too (TANH
    "approx": the GPU's own tanh.approx.f32, for bf16 training);
  - bf16 inputs are loaded as bf16 and computed in fp32 (add, tanh, sums); the scores come out
    fp32, the gradients in the dtypes of hm, ws and w.
The two ops are torch.library custom ops, so compiled code keeps them as opaque calls with a
registered backward.

Needs triton (not a requirement of the project: CI and CPUs never import this file unless the
switch is used). Left out: autotuning; one backward kernel for both d ws and d hm (it would
need atomic adds or a (B, T tiles, S, d) partial sum).
"""
import torch
import triton
import triton.language as tl

TWO_LOG2E = tl.constexpr(2 * 1.4426950408889634)     # 2 log2(e): e^{2x} = exp2(2 log2(e) x)
# (BT, BS, BK, warps) of each kernel: a (BT, BS, BK) fp32 tile a program, 16K elements on 8 warps,
# 64 a thread. Built for sm_90 on a CPU (python bench/check_triton.py additive --build): at most
# 128 registers a thread, no stack (no spill), no shuffle inside the loops. Timed on an H200 at
# PALM's training shape (bench/RESULTS.md, training throughput): 2.62 ms forward + backward,
# against 2.05 ms for (16, 16, 32) on 4 warps and 12.16 ms for the compiled function. A whole PALM
# step (bench/bench_train.py, H200): 45.9 ms against 56.2 ms compiled, so fast.speed_up uses these
# kernels for training; the tiles stay as first chosen (the other shape is untimed there).
FORWARD = (32, 32, 16, 8)
BACKWARD_WS = (32, 32, 16, 8)    # program per (b, T tile, K chunk), over the S tiles
BACKWARD_HM = (32, 32, 16, 8)    # program per (b, S tile, K chunk), over the T tiles
# How the kernels compute tanh (read at every launch, so a benchmark can time both in one run):
# "exp2", 1 - 2 / (exp2(2 x log2(e)) + 1), two of the GPU's special-function instructions (exp2 and
# a reciprocal), fp32-exact to ~1e-7, and what the interpreter runs; "approx", PTX tanh.approx.f32
# (sm_75 and later, GPU only): one instruction, relative error up to 2^-11, as much as bf16
# inputs' rounding, so for bf16 training only (bench/check_triton.py additive checks it there).
TANH = "exp2"


@triton.jit
def _tanh(x, TANH: tl.constexpr):
    """tanh(x) = 1 - 2 / (e^{2x} + 1), through exp2: exactly +-1 for large |x|, never NaN. TANH
    "approx": the GPU's tanh.approx.f32 instead (see TANH above)."""
    if TANH == "approx":
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return 1.0 - 2.0 / (tl.exp2(x * TWO_LOG2E) + 1.0)


@triton.jit
def _rows(PTR, sb, sr, b, r, n, k, D):
    """Rows r (R,) of a (B, n, D) tensor at b, columns k (K,) -> (R, K) fp32, zeros outside."""
    inside = (r < n)[:, None] & (k < D)[None, :]
    x = tl.load(PTR + b * sb + r[:, None] * sr + k[None, :], mask=inside, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _grad_tile(G, b, t, j, T, S):
    """g[b, t, j] (BT, BS) fp32 of the (B, T, S) upstream gradient, zeros outside."""
    inside = (t < T)[:, None] & (j < S)[None, :]
    return tl.load(G + (b * T + t[:, None]) * S + j[None, :], mask=inside, other=0.0)


@triton.jit
def _additive_forward(HM, WS, W, E, sh_b, sh_s, sw_b, sw_t, T, S, D,
                      BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr,
                          TANH: tl.constexpr):
    """One (BT, BS) tile of scores e[b] (Eq. 3)."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    j = tl.program_id(1) * BS + tl.arange(0, BS)
    b = tl.program_id(2)
    # summed over the chunks' columns once at the end (a sum across threads)
    acc = tl.zeros([BT, BS, BK], tl.float32)
    for k0 in range(0, D, BK):
        k = k0 + tl.arange(0, BK)
        ws = _rows(WS, sw_b, sw_t, b, t, T, k, D)                        # (BT, BK)
        hm = _rows(HM, sh_b, sh_s, b, j, S, k, D)                        # (BS, BK)
        # w is 0 past d: the padded columns add nothing
        w = tl.load(W + k, mask=k < D, other=0.0).to(tl.float32)         # (BK,)
        u = _tanh(ws[:, None, :] + hm[None, :, :], TANH)                 # (BT, BS, BK)
        # e_t,j = sum_k w_k tanh(hm_j,k + ws_t,k)
        acc += u * w[None, None, :]
    e = tl.sum(acc, 2)
    tl.store(E + (b * T + t[:, None]) * S + j[None, :], e, mask=(t < T)[:, None] & (j < S)[None, :])


@triton.jit
def _additive_backward_ws(G, HM, WS, W, DWS, DW_PARTS, sh_b, sh_s, sw_b, sw_t, sd_b, sd_t,
                          T, S, D, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr,
                          TANH: tl.constexpr):
    """One (BT, BK) tile of d ws[b] over the S tiles, and this program's partial d w (BK,) into
    DW_PARTS[b, T tile]."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    b = tl.program_id(2)
    ws = _rows(WS, sw_b, sw_t, b, t, T, k, D)                            # (BT, BK)
    w = tl.load(W + k, mask=k < D, other=0.0).to(tl.float32)             # (BK,)
    dws = tl.zeros([BT, BK], tl.float32)
    # d w by row t, summed over the rows once at the end (a sum across warps)
    dw = tl.zeros([BT, BK], tl.float32)
    for j0 in range(0, S, BS):
        j = j0 + tl.arange(0, BS)
        hm = _rows(HM, sh_b, sh_s, b, j, S, k, D)                        # (BS, BK)
        # j first, as in _additive_backward_hm the loop's operand: the sums over j stay in a thread
        g = tl.trans(_grad_tile(G, b, t, j, T, S))[:, :, None]           # (BS, BT, 1), 0 outside
        u = _tanh(hm[:, None, :] + ws[None, :, :], TANH)                 # (BS, BT, BK)
        # d w_k = sum_{t, j} g_t,j u_t,j,k
        dw += tl.sum(g * u, 0)
        # d ws_t,k = sum_j g_t,j w_k (1 - u^2)
        dws += tl.sum(g * (1.0 - u * u), 0) * w[None, :]
    inside = (t < T)[:, None] & (k < D)[None, :]
    tl.store(DWS + b * sd_b + t[:, None] * sd_t + k[None, :], dws.to(DWS.dtype.element_ty),
             mask=inside)
    tl.store(DW_PARTS + (b * tl.num_programs(0) + tl.program_id(0)) * D + k, tl.sum(dw, 0),
             mask=k < D)


@triton.jit
def _additive_backward_hm(G, HM, WS, W, DHM, sh_b, sh_s, sw_b, sw_t, sd_b, sd_s, T, S, D,
                          BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr,
                          TANH: tl.constexpr):
    """One (BS, BK) tile of d hm[b] over the T tiles."""
    j = tl.program_id(0) * BS + tl.arange(0, BS)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    b = tl.program_id(2)
    hm = _rows(HM, sh_b, sh_s, b, j, S, k, D)                            # (BS, BK)
    w = tl.load(W + k, mask=k < D, other=0.0).to(tl.float32)             # (BK,)
    dhm = tl.zeros([BS, BK], tl.float32)
    for t0 in range(0, T, BT):
        t = t0 + tl.arange(0, BT)
        ws = _rows(WS, sw_b, sw_t, b, t, T, k, D)                        # (BT, BK)
        g = _grad_tile(G, b, t, j, T, S)[:, :, None]                     # (BT, BS, 1), 0 outside
        u = _tanh(ws[:, None, :] + hm[None, :, :], TANH)                 # (BT, BS, BK)
        # d hm_j,k = sum_t g_t,j w_k (1 - u^2)
        dhm += tl.sum(g * (1.0 - u * u), 0) * w[None, :]
    inside = (j < S)[:, None] & (k < D)[None, :]
    tl.store(DHM + b * sd_b + j[:, None] * sd_s + k[None, :], dhm.to(DHM.dtype.element_ty),
             mask=inside)


# --------------------------------------------------------------------------------------------------
# The ops: launches, and their autograd


def _tanh_way():
    """TANH, checked."""
    if TANH not in ("exp2", "approx"):
        raise ValueError(f"triton_additive: TANH {TANH!r} is not exp2 or approx")
    return TANH


def _unit_stride(t):
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("unigen::additive_scores", mutates_args=())
def additive_scores_op(hm: torch.Tensor, ws: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """-> e (B, T, S) fp32."""
    hm, ws, w = (_unit_stride(x) for x in (hm, ws, w))
    B, S, D = hm.shape
    T = ws.size(1)
    e = hm.new_empty(B, T, S, dtype=torch.float32)
    if e.numel() == 0:
        return e.zero_()
    BT, BS, BK, warps = FORWARD
    _additive_forward[(triton.cdiv(T, BT), triton.cdiv(S, BS), B)](
        hm, ws, w, e, hm.stride(0), hm.stride(1), ws.stride(0), ws.stride(1), T, S, D,
        BT=BT, BS=BS, BK=BK, TANH=_tanh_way(), num_warps=warps)
    return e


@additive_scores_op.register_fake
def _(hm, ws, w):
    return hm.new_empty(hm.size(0), ws.size(1), hm.size(1), dtype=torch.float32)


@torch.library.custom_op("unigen::additive_scores_backward", mutates_args=())
def additive_scores_backward(g: torch.Tensor, hm: torch.Tensor, ws: torch.Tensor, w: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g (B, T, S) -> d hm (B, S, d), d ws (B, T, d), d w (d,), in the dtypes of hm, ws, w."""
    hm, ws, w = (_unit_stride(x) for x in (hm, ws, w))
    g = g.float().contiguous()
    B, S, D = hm.shape
    T = ws.size(1)
    dhm, dws = torch.empty_like(hm), torch.empty_like(ws)
    if g.numel() == 0:
        return dhm.zero_(), dws.zero_(), torch.zeros_like(w)
    tanh = _tanh_way()
    BT, BS, BK, warps = BACKWARD_WS
    n_parts = triton.cdiv(T, BT)
    parts = hm.new_empty(B, n_parts, D, dtype=torch.float32)
    _additive_backward_ws[(n_parts, triton.cdiv(D, BK), B)](
        g, hm, ws, w, dws, parts, hm.stride(0), hm.stride(1), ws.stride(0), ws.stride(1),
        dws.stride(0), dws.stride(1), T, S, D, BT=BT, BS=BS, BK=BK, TANH=tanh, num_warps=warps)
    BT, BS, BK, warps = BACKWARD_HM
    _additive_backward_hm[(triton.cdiv(S, BS), triton.cdiv(D, BK), B)](
        g, hm, ws, w, dhm, hm.stride(0), hm.stride(1), ws.stride(0), ws.stride(1),
        dhm.stride(0), dhm.stride(1), T, S, D, BT=BT, BS=BS, BK=BK, TANH=tanh, num_warps=warps)
    # the partial d w of every (b, T tile), summed once
    return dhm, dws, parts.sum((0, 1)).to(w.dtype)


@additive_scores_backward.register_fake
def _(g, hm, ws, w):
    return torch.empty_like(hm), torch.empty_like(ws), torch.empty_like(w)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, g):
    hm, ws, w = ctx.saved_tensors
    return additive_scores_backward(g, hm, ws, w)


additive_scores_op.register_autograd(_backward, setup_context=_setup_context)


def additive_scores(hm, ws, w):
    """PALM's Eq. 3 scores e (B, T, S) fp32 = w . tanh(hm_j + ws_t), hm (B, S, d), ws (B, T, d),
    w (d,). Twin: model.additive_scores (bench/check_triton.py additive; bench/check_cuda.py)."""
    return additive_scores_op(hm, ws, w)

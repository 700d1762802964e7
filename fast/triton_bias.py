"""Flash attention with UniLMv2's relative position bias and the project's mask rule, in Triton.

The GPU speed layer's kernel for the pmlm objective (fast/ reaches it through one switch,
fast.use_triton_bias(model)). It equals the readable path, Transformer.encode's

    naive_attention(q, k, v, mask, bias)     mask = masks.attention_mask(kind, step), padding
                                              queries seeing themselves; bias = the model's
                                              RelativePositionBias at the position ids (4.1)

in values and in the gradients of q, k, v and the bias table (bench/check_triton.py: on a CPU
through Triton's interpreter, TRITON_INTERPRET=1, at small sizes; bench/check_cuda.py on a GPU at
base size, fp32 and bf16). Why a kernel: SDPA cannot take a bias that needs a gradient on its flash
path (it falls back to the memory-efficient kernel and writes a (B, H, L, L) bias gradient), and
FlexAttention adds the bias gradient atomically into one table (bench/RESULTS.md has the numbers).

What happens inside, per (query tile, key tile) of one (batch row, head):
  - the tile is skipped when the mask allows none of its pairs (a per-batch table of 32 x 32 tile
    states, built once for every layer: 0 empty, 1 partial, 2 full); a full tile skips the mask;
  - the mask of a partial tile is masks.may_attend itself, compiled into the kernel (its own code:
    one rule for every path), from the per-token kind and step (and passage, for packed rows);
  - the bias is read from the per-head table of distances, bias[h, pos_k - pos_q], the
    model's table gathered through RelativePositionBias.distance_bucket (the same bucket function);
  - forward: online softmax in base 2 (FlashAttention-2), the log-sum-exp kept for backward;
  - backward: one kernel for dK and dV (a key tile over its query tiles), one for dQ (a query tile
    over its key tiles), which also reduces the bias gradient dS by bucket into a partial table
    per program; the partial tables are summed once afterwards (no atomic adds);
  - the reduction by bucket: where a key tile's keys hold consecutive positions (the text, most
    tiles; queries may be anywhere), pair (i, j) is at distance shift_i + j, so a bucket (a run of
    distances) covers consecutive keys of each row: its sum is a difference of two prefix sums
    along the row, read at the bucket's bounds (one cumsum and two gathers a tile, whatever the
    buckets it spans). Other tiles ([P]/[M] keys reusing positions, a packed row's passage
    boundary) take one masked sum per bucket they span (TABLE_GRADIENT keeps that everywhere).
The two ops are torch.library custom ops, so the compiled blocks (fast.compile_blocks) keep them
as opaque calls with a registered backward.

Needs triton (not a requirement of the project: CI and CPUs never import this file unless the
switch is used). Triton's interpreter gets bf16 matrix products wrong, so there (only) the kernels
multiply bf16 tiles in fp32: exact products, as the tensor cores make them. Left out: dropout on
the attention weights (as the FlexAttention path), a KV cache (decoding keeps the SDPA path), head
sizes other than 16, 32, 64 and 128, autotuning.
"""
import math
import os
import types
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from objectives import masks

TILE = 32                      # the granularity of the tile-state table
LOG2E = 1.4426950408889634     # log2(e): the kernels use exp2
# (query rows, key columns, warps, stages) of each kernel's tiles, multiples of TILE. Chosen so that
# the sm_90 build keeps (nearly) everything in registers (built on a CPU with triton's ptxas: at
# most 8 bytes of stack a thread, bf16): the bias gather holds a 64-bit address per score, and
# 128 x 64 tiles on 4 warps spilled 2 KB a thread. Not timed against other shapes on a GPU.
FORWARD = (128, 32, 8, 2)
BACKWARD_KV = (32, 128, 8, 2)
BACKWARD_Q = (128, 32, 8, 2)
# How _backward_q reduces the bias table's gradient dS by bucket (read at every launch, so a
# benchmark can time both in one run): "prefix", a prefix sum along each row of the tile read at
# the bucket bounds (a cost that does not grow with the buckets a tile spans), where the tile's keys
# hold consecutive positions, else "loop"; "loop" everywhere, one masked sum per bucket the tile
# spans (the kernel before; 3x the forward's time in a pmlm step, bench/RESULTS.md).
TABLE_GRADIENT = "prefix"

# masks.may_attend as a Triton function: its own code, with the token kinds as Triton constants
_RULE_GLOBALS = {name: tl.constexpr(getattr(masks, name))
                 for name in ("PAD", "CTX", "ORIG", "PSEUDO", "SPAN")}
_RULE_GLOBALS.update(tl=tl, __name__=masks.__name__)
may_attend = triton.jit(types.FunctionType(masks.may_attend.__code__, _RULE_GLOBALS, "may_attend"))
PAD = tl.constexpr(masks.PAD)


# --------------------------------------------------------------------------------------------------
# What the kernels read, built once per batch and shared by the layers


class Inputs(NamedTuple):
    """The mask and the bias of one batch, as the kernels read them; fast.describe_flex hands it to
    every block in place of a mask (its attend is the attention call)."""
    table: torch.Tensor            # (num_buckets, H) the learned bias table (a zero row: no bias)
    distance_bucket: torch.Tensor  # (2P - 1,) int32, the bucket of each distance -(P-1) .. P-1
    bucket_bounds: torch.Tensor    # (3, NB) int32: each bucket's first and last distance, and
                                   # whether every bucket is one run of distances (bucket_bounds)
    position_ids: torch.Tensor     # (B, L) int32
    kind: torch.Tensor             # (B, L) int32, masks.PAD ... masks.SPAN
    step: torch.Tensor             # (B, L) int32
    passage: torch.Tensor          # (B, L) int32: packed rows' passage of each token (else 0)
    tiles: torch.Tensor            # (B, n, n) int8, n = ceil(L / TILE): 0 empty, 1 partial, 2 full

    def attend(self, q, k, v):
        """q, k, v (B, H, L, D) -> (B, H, L, D)."""
        return attention(q, k, v, self)


def padded_buckets(n_buckets):
    """The bucket axis of _backward_q's tables: the buckets padded to a power of 2 (at least 2)."""
    return triton.next_power_of_2(max(n_buckets, 2))


def bucket_bounds(distance_bucket, n_buckets):
    """(2P - 1,) bucket of each distance -(P-1) .. P-1 -> (3, NB) int32, NB = padded_buckets:
    row 0 each bucket's first distance, row 1 its last (a bucket no distance has: last = first - 1,
    an empty run), row 2 all 1 if every bucket is one run of consecutive distances (T5's buckets
    are), else all 0 (then _backward_q sums every tile bucket by bucket). Made on the device
    without waiting for it."""
    NB = padded_buckets(n_buckets)
    b = distance_bucket.long()
    offset = (b.numel() - 1) // 2
    d = torch.arange(b.numel(), device=b.device) - offset
    first = torch.full((NB,), offset + 1, device=b.device).scatter_reduce(0, b, d, "amin")
    last = torch.full((NB,), -offset - 1, device=b.device).scatter_reduce(0, b, d, "amax")
    count = torch.zeros(NB, dtype=torch.long, device=b.device).index_add_(0, b, torch.ones_like(b))
    last = torch.where(count > 0, last, first - 1)
    runs = (count == last - first + 1).all().long().expand(NB)
    return torch.stack([first, last, runs]).to(torch.int32).contiguous()


def tile_states(allowed):
    """(B, L, L) bool mask -> (B, n, n) int8 state of each TILE x TILE tile: 0 no pair allowed
    (skipped), 1 some (the kernel applies the rule), 2 all (the kernel skips the rule). A tile that
    reaches past L is never full, so the kernels' bounds checks run wherever they matter."""
    B, L, _ = allowed.shape
    n = -(-L // TILE)
    padded = allowed.new_zeros(B, n * TILE, n * TILE)
    padded[:, :L, :L] = allowed
    t = padded.view(B, n, TILE, n, TILE)
    return (t.any(4).any(2).to(torch.int8) + t.all(4).all(2).to(torch.int8))


def inputs(model, position_ids, spec):
    """The Inputs of one batch: model a Transformer (with or without the relative bias),
    position_ids (B, L), spec a masks.MaskSpec."""
    B, L = spec.kind.shape
    dev = spec.kind.device
    # the dense rule once per batch, for the tile states only (the kernels apply it themselves)
    passage = getattr(spec, "passage", None)
    passage = torch.zeros_like(spec.kind) if passage is None else passage
    allowed = spec.dense() & (passage[:, :, None] == passage[:, None, :])  # (B, L, L)
    eye = torch.eye(L, dtype=torch.bool, device=dev)
    allowed = allowed | (eye & (spec.kind == masks.PAD)[:, :, None])   # padding sees itself
    rel = model.rel_bias
    if rel is not None:
        table, distance_bucket = rel.table.weight, rel.distance_bucket
    else:
        # no relative bias: one zero bucket, every distance in it
        P = model.config.max_position
        table = torch.zeros(1, model.config.n_head, device=dev)
        distance_bucket = torch.zeros(2 * P - 1, dtype=torch.long, device=dev)
    i32 = lambda t: t.to(torch.int32).contiguous()
    return Inputs(table, i32(distance_bucket), bucket_bounds(distance_bucket, table.size(0)),
                  i32(position_ids), i32(spec.kind), i32(spec.step), i32(passage),
                  tile_states(allowed))


# --------------------------------------------------------------------------------------------------
# Pieces the kernels share


@triton.jit
def _tile_state(TILES, b, n, row0, col0, ROWS: tl.constexpr, COLS: tl.constexpr):
    """State (0, 1, 2) of the block of TILE x TILE tiles starting at tile (row0, col0), ROWS x COLS
    tiles: empty only if all are empty, full only if all are full."""
    r = row0 + tl.arange(0, ROWS)
    c = col0 + tl.arange(0, COLS)
    inside = (r[:, None] < n) & (c[None, :] < n)
    s = tl.load(TILES + (b * n + r[:, None]) * n + c[None, :], mask=inside, other=0)
    return tl.where(tl.max(s) == 0, 0, tl.where(tl.min(s) == 2, 2, 1))


@triton.jit
def _tokens(POS, KIND, STEP, PASSAGE, b, L, idx):
    """Position, kind, step and passage of tokens idx of row b (padding past L)."""
    inside = idx < L
    pos = tl.load(POS + b * L + idx, mask=inside, other=0)
    kind = tl.load(KIND + b * L + idx, mask=inside, other=PAD)
    step = tl.load(STEP + b * L + idx, mask=inside, other=0)
    passage = tl.load(PASSAGE + b * L + idx, mask=inside, other=-1)
    return pos, kind, step, passage


@triton.jit
def _allowed(qi, q_kind, q_step, q_passage, kj, k_kind, k_step, k_passage, L):
    """(rows, cols) bool: masks.may_attend, within one passage, a padding query seeing itself
    (Transformer.encode), nothing past L."""
    same = qi[:, None] == kj[None, :]
    ok = may_attend(q_kind[:, None], q_step[:, None], k_kind[None, :], k_step[None, :], same)
    ok = ok & (q_passage[:, None] == k_passage[None, :])
    ok = ok | ((q_kind[:, None] == PAD) & same)
    return ok & (qi[:, None] < L) & (kj[None, :] < L)


@triton.jit
def _block(PTR, sb, sh, sl, b, h, idx, L, D: tl.constexpr):
    """Rows idx of a (B, H, L, D) tensor at (b, h) -> (len(idx), D), zeros past L."""
    d = tl.arange(0, D)
    ptrs = PTR + b * sb + h * sh + idx[:, None] * sl + d[None, :]
    return tl.load(ptrs, mask=(idx < L)[:, None], other=0.0)


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b, accumulated in fp32. PREC "upcast" (Triton's interpreter only, whose bf16 products
    are wrong): the products in fp32, exact for bf16 inputs, as the tensor cores make them."""
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _scores(q, k, q_pos, k_pos, BIAS, h, n_dist, offset, scale2, PREC: tl.constexpr):
    """(rows, cols) scores in base 2: (q k^T / sqrt(d) + bias[h, pos_k - pos_q]) * log2(e)."""
    qk = _dot(q, tl.trans(k), PREC)
    dist = k_pos[None, :] - q_pos[:, None] + offset
    return qk * scale2 + tl.load(BIAS + h * n_dist + dist)


# --------------------------------------------------------------------------------------------------
# Forward


@triton.jit
def _forward(Q, K, V, O, LSE, BIAS, POS, KIND, STEP, PASSAGE, TILES,
             sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, so_b, so_h, so_l,
             H, L, n_tiles, n_dist, offset, scale2,
             BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr,
             PREC: tl.constexpr):
    """One query tile (BM rows) of one (batch row, head): O and the log2-sum-exp."""
    m_block = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    qi = m_block * BM + tl.arange(0, BM)
    q = _block(Q, sq_b, sq_h, sq_l, b, h, qi, L, D)
    q_pos, q_kind, q_step, q_passage = _tokens(POS, KIND, STEP, PASSAGE, b, L, qi)
    m_i = tl.full([BM], float("-inf"), tl.float32)          # running max (base 2)
    l_i = tl.zeros([BM], tl.float32)                        # running sum of exp2
    acc = tl.zeros([BM, D], tl.float32)
    for n_block in range(0, tl.cdiv(L, BN)):
        state = _tile_state(TILES, b, n_tiles, m_block * (BM // TILE), n_block * (BN // TILE),
                            BM // TILE, BN // TILE)
        if state != 0:
            kj = n_block * BN + tl.arange(0, BN)
            k = _block(K, sk_b, sk_h, sk_l, b, h, kj, L, D)
            v = _block(V, sv_b, sv_h, sv_l, b, h, kj, L, D)
            k_pos, k_kind, k_step, k_passage = _tokens(POS, KIND, STEP, PASSAGE, b, L, kj)
            s = _scores(q, k, q_pos, k_pos, BIAS, h, n_dist, offset, scale2, PREC)
            if state == 1:
                ok = _allowed(qi, q_kind, q_step, q_passage, kj, k_kind, k_step, k_passage, L)
                s = tl.where(ok, s, float("-inf"))
            # FlashAttention-2's online softmax; a row with nothing allowed yet keeps max -inf
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)
            m_i = m_new
    # every real row allows at least itself, so l_i >= 1 there
    o = acc / l_i[:, None]
    d = tl.arange(0, D)
    inside = qi < L
    tl.store(O + b * so_b + h * so_h + qi[:, None] * so_l + d[None, :], o.to(O.dtype.element_ty),
             mask=inside[:, None])
    tl.store(LSE + (b * H + h) * L + qi, m_i + tl.log2(l_i), mask=inside)


# --------------------------------------------------------------------------------------------------
# Backward: dS = P * (dP - delta), delta = rowsum(dO * O); dQ = dS K / sqrt(d),
# dK = dS^T Q / sqrt(d), dV = P^T dO, d table[bucket] = sum of dS over the pairs in that bucket


@triton.jit
def _backward_kv(Q, K, V, DO, LSE, DELTA, DK, DV, BIAS, POS, KIND, STEP, PASSAGE, TILES,
                 sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sd_b, sd_h, sd_l,
                 sg_b, sg_h, sg_l, H, L, n_tiles, n_dist, offset, scale2, scale,
                 BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr,
                 PREC: tl.constexpr):
    """One key tile (BN keys) of one (batch row, head) over its query tiles: dK and dV."""
    n_block = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    kj = n_block * BN + tl.arange(0, BN)
    k = _block(K, sk_b, sk_h, sk_l, b, h, kj, L, D)
    v = _block(V, sv_b, sv_h, sv_l, b, h, kj, L, D)
    k_pos, k_kind, k_step, k_passage = _tokens(POS, KIND, STEP, PASSAGE, b, L, kj)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for m_block in range(0, tl.cdiv(L, BM)):
        state = _tile_state(TILES, b, n_tiles, m_block * (BM // TILE), n_block * (BN // TILE),
                            BM // TILE, BN // TILE)
        if state != 0:
            qi = m_block * BM + tl.arange(0, BM)
            q = _block(Q, sq_b, sq_h, sq_l, b, h, qi, L, D)
            do = _block(DO, sd_b, sd_h, sd_l, b, h, qi, L, D)
            q_pos, q_kind, q_step, q_passage = _tokens(POS, KIND, STEP, PASSAGE, b, L, qi)
            lse = tl.load(LSE + (b * H + h) * L + qi, mask=qi < L, other=0.0)
            delta = tl.load(DELTA + (b * H + h) * L + qi, mask=qi < L, other=0.0)
            s = _scores(q, k, q_pos, k_pos, BIAS, h, n_dist, offset, scale2, PREC)
            p = tl.exp2(s - lse[:, None])                                  # (BM, BN)
            if state == 1:
                ok = _allowed(qi, q_kind, q_step, q_passage, kj, k_kind, k_step, k_passage, L)
                p = tl.where(ok, p, 0.0)
            dv += _dot(tl.trans(p.to(do.dtype)), do, PREC)
            dp = _dot(do, tl.trans(v), PREC)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(q.dtype)), q, PREC)
    d = tl.arange(0, D)
    inside = (kj < L)[:, None]
    offs = b * sg_b + h * sg_h + kj[:, None] * sg_l + d[None, :]
    tl.store(DK + offs, (dk * scale).to(DK.dtype.element_ty), mask=inside)
    tl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=inside)


@triton.jit
def _prefix_at(c, x):
    """c (rows, cols) prefix sums along each row (inclusive), x (rows, n) in 0 .. cols -> (rows, n)
    the sum of the first x entries of each row: c[row, x - 1], 0 where x is 0."""
    return tl.where(x == 0, 0.0, tl.gather(c, tl.maximum(x - 1, 0), 1))


@triton.jit
def _table_by_prefix(ds, shift, first, last, BN: tl.constexpr):
    """ds (BM, BN) of a key tile whose keys hold consecutive positions, so that pair (i, j) is at
    distance shift[i] + j; bucket n holds the distances first[n] .. last[n]. -> (BM, NB) each
    row's dS summed by bucket: a bucket's pairs in a row are consecutive entries, so its sum is a
    difference of two prefix sums of the row, whatever the buckets the tile spans."""
    c = tl.cumsum(ds, 1)
    # (BM, NB): how many of a row's keys lie before the bucket, and up to its end
    before = tl.minimum(tl.maximum(first[None, :] - shift[:, None], 0), BN)
    through = tl.minimum(tl.maximum(last[None, :] + 1 - shift[:, None], 0), BN)
    return _prefix_at(c, through) - _prefix_at(c, before)


@triton.jit
def _table_by_loop(ds, BUCKET, q_pos, k_pos, offset, buckets, NB: tl.constexpr):
    """ds (BM, BN) of a tile of any positions, BUCKET the bucket of each distance, buckets
    arange(NB) -> (BM, NB) each row's dS summed by bucket: one masked sum per bucket the tile
    spans."""
    bucket = tl.load(BUCKET + k_pos[None, :] - q_pos[:, None] + offset)     # (BM, BN)
    dtable = tl.zeros([ds.shape[0], NB], tl.float32)
    lo = tl.min(tl.where(ds != 0.0, bucket, NB))
    hi = tl.max(tl.where(ds != 0.0, bucket, -1))
    for j in range(lo, hi + 1):
        row_sum = tl.sum(tl.where(bucket == j, ds, 0.0), 1)               # (BM,)
        dtable += tl.where(buckets[None, :] == j, row_sum[:, None], 0.0)
    return dtable


@triton.jit
def _backward_q(Q, K, V, DO, LSE, DELTA, DQ, DTABLE, BIAS, BUCKET, BOUNDS, POS, KIND, STEP,
                PASSAGE, TILES, sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sd_b, sd_h,
                sd_l, sg_b, sg_h, sg_l, H, L, n_tiles, n_dist, offset, scale2, scale,
                BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr,
                NB: tl.constexpr, PREC: tl.constexpr, TABLE: tl.constexpr):
    """One query tile (BM rows) of one (batch row, head) over its key tiles: dQ, and this
    program's partial bias-table gradient (NB buckets) into DTABLE[b, h, m_block]. TABLE: how dS
    is summed by bucket (TABLE_GRADIENT)."""
    m_block = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    qi = m_block * BM + tl.arange(0, BM)
    q = _block(Q, sq_b, sq_h, sq_l, b, h, qi, L, D)
    do = _block(DO, sd_b, sd_h, sd_l, b, h, qi, L, D)
    q_pos, q_kind, q_step, q_passage = _tokens(POS, KIND, STEP, PASSAGE, b, L, qi)
    lse = tl.load(LSE + (b * H + h) * L + qi, mask=qi < L, other=0.0)
    delta = tl.load(DELTA + (b * H + h) * L + qi, mask=qi < L, other=0.0)
    dq = tl.zeros([BM, D], tl.float32)
    buckets = tl.arange(0, NB)
    if TABLE == "prefix":
        # each bucket's first and last distance; runs: every bucket is one run of distances
        first = tl.load(BOUNDS + buckets)
        last = tl.load(BOUNDS + NB + buckets)
        runs = tl.min(tl.load(BOUNDS + 2 * NB + buckets))
    # per row and bucket, summed over rows once at the end: a sum along a row stays in its warp
    dtable = tl.zeros([BM, NB], tl.float32)
    for n_block in range(0, tl.cdiv(L, BN)):
        state = _tile_state(TILES, b, n_tiles, m_block * (BM // TILE), n_block * (BN // TILE),
                            BM // TILE, BN // TILE)
        if state != 0:
            kj = n_block * BN + tl.arange(0, BN)
            k = _block(K, sk_b, sk_h, sk_l, b, h, kj, L, D)
            v = _block(V, sv_b, sv_h, sv_l, b, h, kj, L, D)
            k_pos, k_kind, k_step, k_passage = _tokens(POS, KIND, STEP, PASSAGE, b, L, kj)
            s = _scores(q, k, q_pos, k_pos, BIAS, h, n_dist, offset, scale2, PREC)
            p = tl.exp2(s - lse[:, None])                                  # (BM, BN)
            if state == 1:
                ok = _allowed(qi, q_kind, q_step, q_passage, kj, k_kind, k_step, k_passage, L)
                p = tl.where(ok, p, 0.0)
            dp = _dot(do, tl.trans(v), PREC)
            ds = p * (dp - delta[:, None])
            dq += _dot(ds.to(k.dtype), k, PREC)
            # the bias gradient: dS summed by bucket
            if TABLE == "prefix":
                # keys at consecutive positions (the text: most tiles) have one position - index
                # (keys past L hold no dS: any position will do)
                run = k_pos - kj
                run_lo = tl.min(tl.where(kj < L, run, 1 << 30))
                run_hi = tl.max(tl.where(kj < L, run, -(1 << 30)))
                if (run_lo == run_hi) & (runs == 1):
                    # the distance of the tile's first key from each query
                    shift = run_lo + n_block * BN - q_pos                   # (BM,)
                    dtable += _table_by_prefix(ds, shift, first, last, BN)
                else:
                    dtable += _table_by_loop(ds, BUCKET, q_pos, k_pos, offset, buckets, NB)
            else:
                dtable += _table_by_loop(ds, BUCKET, q_pos, k_pos, offset, buckets, NB)
    d = tl.arange(0, D)
    tl.store(DQ + b * sg_b + h * sg_h + qi[:, None] * sg_l + d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=(qi < L)[:, None])
    part = (b * H + h) * tl.num_programs(0) + m_block
    tl.store(DTABLE + part * NB + buckets, tl.sum(dtable, 0))


# --------------------------------------------------------------------------------------------------
# The ops: launches, and their autograd


def _strides(t):
    """(batch, head, row) strides of a (B, H, L, D) tensor."""
    return t.stride(0), t.stride(1), t.stride(2)


def _like_heads(q):
    """An empty (B, H, L, D) tensor stored as (B, L, H, D): what SelfAttention reshapes next."""
    B, H, L, D = q.shape
    return q.new_empty(B, L, H, D).transpose(1, 2)


def _launch_constants(q, table, distance_bucket, tiles):
    """What every kernel takes besides the tensors."""
    B, H, L, D = q.shape
    if D not in (16, 32, 64, 128):
        raise ValueError(f"triton_bias: head size {D} is not 16, 32, 64 or 128")
    # the bias table by distance and head, in base 2: bias[h, d + offset] (H, 2P - 1)
    bias = (table.float().t()[:, distance_bucket] * LOG2E).contiguous()
    n_dist = distance_bucket.numel()
    scale = 1.0 / math.sqrt(D)
    # fp32: exact products, as the naive path; bf16: the tensor cores (upcast in the interpreter)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    if os.environ.get("TRITON_INTERPRET") == "1" and q.dtype != torch.float32:
        prec = "upcast"
    return dict(H=H, L=L, n_tiles=tiles.size(-1), n_dist=n_dist, offset=(n_dist - 1) // 2,
                scale2=scale * LOG2E, D=D, TILE=TILE, PREC=prec), bias, scale


def _unit_stride(t):
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("unigen::bias_attention", mutates_args=())
def bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                   distance_bucket: torch.Tensor, bucket_bounds: torch.Tensor,
                   position_ids: torch.Tensor, kind: torch.Tensor, step: torch.Tensor,
                   passage: torch.Tensor, tiles: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> attention output (B, H, L, D) and the log2-sum-exp of every row (B, H, L) fp32."""
    q, k, v = (_unit_stride(t) for t in (q, k, v))
    B, H, L, D = q.shape
    const, bias, _ = _launch_constants(q, table, distance_bucket, tiles)
    o = _like_heads(q)
    lse = q.new_empty(B, H, L, dtype=torch.float32)
    BM, BN, warps, stages = FORWARD
    _forward[(triton.cdiv(L, BM), B * H)](
        q, k, v, o, lse, bias, position_ids, kind, step, passage, tiles,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o), **const,
        BM=BM, BN=BN, num_warps=warps, num_stages=stages)
    return o, lse


@bias_attention.register_fake
def _(q, k, v, table, distance_bucket, bucket_bounds, position_ids, kind, step, passage, tiles):
    B, H, L, D = q.shape
    return _like_heads(q), q.new_empty(B, H, L, dtype=torch.float32)


@torch.library.custom_op("unigen::bias_attention_backward", mutates_args=())
def bias_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            o: torch.Tensor, lse: torch.Tensor, table: torch.Tensor,
                            distance_bucket: torch.Tensor, bucket_bounds: torch.Tensor,
                            position_ids: torch.Tensor, kind: torch.Tensor, step: torch.Tensor,
                            passage: torch.Tensor, tiles: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> dq, dk, dv (B, H, L, D) and d table (num_buckets, H)."""
    do, q, k, v = (_unit_stride(t) for t in (do, q, k, v))
    B, H, L, D = q.shape
    const, bias, scale = _launch_constants(q, table, distance_bucket, tiles)
    delta = (do.float() * o.float()).sum(-1).contiguous()                # (B, H, L)
    dq, dk, dv = _like_heads(q), _like_heads(k), _like_heads(v)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq))
    BM, BN, warps, stages = BACKWARD_KV
    _backward_kv[(triton.cdiv(L, BN), B * H)](
        q, k, v, do, lse, delta, dk, dv, bias, position_ids, kind, step, passage, tiles,
        *strides, **const, scale=scale, BM=BM, BN=BN, num_warps=warps, num_stages=stages)
    if TABLE_GRADIENT not in ("prefix", "loop"):
        raise ValueError(f"triton_bias: TABLE_GRADIENT {TABLE_GRADIENT!r} is not prefix or loop")
    n_buckets = table.size(0)
    NB = padded_buckets(n_buckets)
    BM, BN, warps, stages = BACKWARD_Q
    n_parts = triton.cdiv(L, BM)
    parts = q.new_empty(B, H, n_parts, NB, dtype=torch.float32)
    _backward_q[(n_parts, B * H)](
        q, k, v, do, lse, delta, dq, parts, bias, distance_bucket, bucket_bounds, position_ids,
        kind, step, passage, tiles, *strides, **const, scale=scale, BM=BM, BN=BN, NB=NB,
        TABLE=TABLE_GRADIENT, num_warps=warps, num_stages=stages)
    # the partial tables, summed once: (B, H, parts, NB) -> (NB, H)
    dtable = parts.sum((0, 2))[:, :n_buckets].t().to(table.dtype).contiguous()
    return dq, dk, dv, dtable


@bias_attention_backward.register_fake
def _(do, q, k, v, o, lse, table, distance_bucket, bucket_bounds, position_ids, kind, step, passage,
      tiles):
    return _like_heads(q), _like_heads(k), _like_heads(v), torch.empty_like(table)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _backward(ctx, do, dlse):
    q, k, v, table, distance_bucket, bounds, pos, kind, step, passage, tiles, o, lse = \
        ctx.saved_tensors
    dq, dk, dv, dtable = bias_attention_backward(do, q, k, v, o, lse, table, distance_bucket,
                                                 bounds, pos, kind, step, passage, tiles)
    return dq, dk, dv, dtable, None, None, None, None, None, None, None


bias_attention.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, inp: Inputs):
    """softmax(q k^T / sqrt(d) + bias, masked) v for q, k, v (B, H, L, D), the mask and bias of
    `inp` -> (B, H, L, D). Twin: model.naive_attention with Transformer.encode's dense mask and
    bias (bench/check_triton.py)."""
    o, _ = bias_attention(q, k, v, inp.table, inp.distance_bucket, inp.bucket_bounds,
                          inp.position_ids, inp.kind, inp.step, inp.passage, inp.tiles)
    return o

"""The fast layer's attention: the relative bias's GPU backward and FlexAttention (the mask as
tiles, the bias as a score_mod); fast/triton_bias.py's Triton kernel is reached through
describe_flex (fast.use_triton_bias). Each piece names its twin in model.py and the test that holds
them equal; fast/__init__.py puts them into model.py's hooks (ATTENTION["flex"],
DESCRIBED["flex"], RelativePositionBias.fast_lookup).
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

import model as M
from objectives.masks import PAD, MaskSpec, may_attend

_COMPILED = {}


# --- Relative position bias: a backward made for a GPU -------------------------------------------
class BucketBias(torch.autograd.Function):
    """bias[b, h, i, j] = table[bucket[b, i, j], h], with a backward made for a GPU.

    Twin: model.RelativePositionBias.lookup (index_select), the same bias and table gradient
    (tests/test_fast.py: exactly, and float64 gradcheck; bench/check_cuda.py on a GPU).
    The plain lookup's backward adds B * Lq * Lk gradient rows into a 32-row table one by one
    (atomic adds on 32 x H addresses: 12 ms a step for UniLMv2 at base size on an H100;
    bench/RESULTS.md, training throughput). Here the sum per bucket is a matrix product with a
    one-hot matrix, in chunks of rows so the GPU has work for every core:
        d table[k, h] = sum_{b, i, j} [bucket[b, i, j] = k] * g[b, h, i, j]
    The bias comes out in `dtype` (the attention's compute dtype), (B, H, Lq, Lk), contiguous.
    """

    @staticmethod
    def forward(ctx, table, buckets, dtype):
        ctx.save_for_backward(buckets)
        ctx.n_buckets = table.size(0)
        ctx.table_dtype = table.dtype
        bias = F.embedding(buckets, table.to(dtype))                    # (B, Lq, Lk, H)
        return bias.permute(0, 3, 1, 2).contiguous()                    # (B, H, Lq, Lk)

    @staticmethod
    def backward(ctx, g):
        buckets, = ctx.saved_tensors
        B, H, Lq, Lk = g.shape
        # chunks of `rows` query rows: B * Lq / rows independent products
        rows = next(r for r in (64, 32, 16, 8, 4, 2, 1) if Lq % r == 0)
        n = B * Lq // rows
        g = g.reshape(B, H, Lq // rows, rows * Lk).transpose(1, 2).reshape(n, H, rows * Lk)
        kinds = torch.arange(ctx.n_buckets, device=g.device)
        onehot = (buckets.reshape(n, rows * Lk, 1) == kinds).to(g.dtype)  # (n, rows * Lk, K)
        # accumulated in fp32 (at least): inside each product and across the chunks
        acc = torch.promote_types(g.dtype, torch.float32)
        if g.is_cuda and g.dtype != acc:
            part = torch.bmm(g, onehot, out_dtype=acc)                  # (n, H, K), bf16 in
        else:
            part = torch.bmm(g, onehot).to(acc)
        grad = part.sum(0)                                              # (H, K)
        return grad.t().to(ctx.table_dtype), None, None


# --- FlexAttention: the mask as tiles, the bias as a score_mod ------------------------------
def mask_mod(spec: MaskSpec):
    """masks.may_attend for one (query, key) pair, FlexAttention's mask_mod. Twin:
    masks.attention_mask (tests/test_attention_paths.py, cell by cell). A padding query sees itself
    here, as Transformer.encode lets it on the dense path, so its softmax stays finite."""
    kind, step, passage = spec.kind, spec.step, spec.passage

    def mod(b, h, q, k):
        q_kind = kind[b, q]
        allowed = may_attend(q_kind, step[b, q], kind[b, k], step[b, k], q == k)
        if passage is not None:
            # packed rows: a token sees only its own passage (tiles between passages are skipped)
            allowed = allowed & (passage[b, q] == passage[b, k])
        return allowed | ((q_kind == PAD) & (q == k))
    return mod


def block_mask(spec: MaskSpec, device):
    """FlexAttention's block-sparse mask: which 128 x 128 tiles hold any allowed pair (the rest are
    skipped: UniLMv2's context never sees the appended part), built once per batch and shared by the
    layers."""
    from torch.nn.attention.flex_attention import create_block_mask
    B, L = spec.kind.shape
    return create_block_mask(mask_mod(spec), B, None, L, L, device=device,
                             _compile=device.type == "cuda")


class FlexBias(NamedTuple):
    """The relative position bias as FlexAttention's score_mod: read one (query, key, head) at a
    time inside the kernel, so no (B, H, L, L) tensor is ever made; its gradient reaches the learned
    table through by_distance. Twin: model.RelativePositionBias (tests/test_attention_paths.py,
    forward on a CPU; bench/check_cuda.py, values and gradients on a GPU). Plain tensors, so that a
    compiled block receives data and makes the score_mod itself.

    FlexAttention's backward adds the bias's gradient into the table it reads, atomically, one add
    per (query, key, head). Read from one (2P - 1, H) table, the queries of a tile all add into the
    same few addresses and wait for each other (a pmlm step took 200 ms on an H100, against 61 ms
    without the bias); the score_mod reads copy q % COPIES of the table instead, in fp32, and the
    copies' gradients are summed by expand's backward (127 ms; bench/RESULTS.md, training
    throughput).
    """
    by_distance: torch.Tensor     # (2P - 1, H): the bias of each distance -(P-1) .. P-1
    position_ids: torch.Tensor    # (B, L)
    offset: int                   # P - 1
    COPIES = 128                  # one per query of a 128-row tile

    @classmethod
    def of(cls, rel_bias, position_ids):
        """The FlexBias of a model.RelativePositionBias at these positions."""
        by_distance = rel_bias.table.weight.index_select(0, rel_bias.distance_bucket)
        return cls(by_distance, position_ids, rel_bias.offset)

    def score_mod(self):
        pos = self.position_ids
        offset = self.offset
        copies = self.COPIES
        table = self.by_distance.float()[None].expand(copies, *self.by_distance.shape)
        table = table.contiguous()                                     # (COPIES, 2P - 1, H)

        def mod(score, b, h, q, k):
            return score + table[q % copies, pos[b, k] - pos[b, q] + offset, h]
        return mod


def flex_attention():
    """torch's flex_attention, compiled once on CUDA (its fast path); eager elsewhere (forward only
    on a CPU)."""
    from torch.nn.attention import flex_attention as fa
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = (torch.compile(fa.flex_attention, dynamic=False)
                             if torch.cuda.is_available() else fa.flex_attention)
    return _COMPILED["flex"]


def flex(q, k, v, mask, bias, dropout_p=0.0):
    """model.ATTENTION["flex"]: q, k, v (B, H, L, D), mask a block_mask, bias a FlexBias or None
    -> (B, H, L, D). Twin: model.naive_attention. FlexAttention has no dropout on the attention
    weights, so this path has none (dropout_p is not used; the residual and embedding dropout
    stay)."""
    # use_triton_bias: the mask is triton_bias.Inputs (mask and bias), its attend the kernel
    if hasattr(mask, "attend"):
        return mask.attend(q, k, v)
    score_mod = bias.score_mod() if bias is not None else None
    return flex_attention()(q, k, v, score_mod=score_mod, block_mask=mask)


def describe_flex(model, position_ids, spec: MaskSpec):
    """model.DESCRIBED["flex"]: what every block of Transformer.encode gets on the FlexAttention
    path -> (the block mask, the FlexBias or None), made once for all layers. Twin:
    Transformer.encode with the dense mask (tests/test_attention_paths.py)."""
    # use_triton_bias: triton_bias's kernel instead of FlexAttention (its Inputs carry both)
    if getattr(model, "triton_bias", False):
        from fast import triton_bias
        return triton_bias.inputs(model, position_ids, spec), None
    if position_ids.device.type != "cuda" and torch.is_grad_enabled():
        raise RuntimeError("attn_impl=flex trains on CUDA only (FlexAttention has no backward "
                           "on a CPU); use sdpa here")
    if position_ids.is_cuda and not M.fast_pieces(torch.cuda.get_device_capability())["flex"]:
        raise RuntimeError("attn_impl=flex needs compute capability 8.0 or more; use sdpa here")
    mask = block_mask(spec, position_ids.device)
    bias = FlexBias.of(model.rel_bias, position_ids) if model.rel_bias is not None else None
    return mask, bias

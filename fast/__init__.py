"""The fast layer: everything in unigen that exists only for GPU speed, below the teaching files.

Read model.py and generate.py first: they hold the papers' rules, the naive and SDPA attention,
the readable relative bias, the readable KV cache and beam search. This file holds the GPU
machinery that computes the same numbers faster (custom autograd functions, FlexAttention block
masks and score_mods, a static-shape cache replayed as a CUDA graph, compile helpers).

The rule: every piece here equals a readable function of the teaching files, named in its
docstring with the test that holds the two equal on a CPU; bench/check_cuda.py holds them equal on
a GPU, values and gradients, at base size.

The switches that reach it (on a CPU the readable path is the default everywhere):
    ModelConfig.attn_impl = "flex"      FlexAttention (Transformer.encode -> encode_flex)
    fast.speed_up(model, compile=...)   train.py on CUDA: BucketBias, Triton (else compiled) copy
                                        scores, compiled blocks
    train.py --pack true (off: default) several passages a row: plan_packing in data.StepBatches,
                                        the Packed view in train.LossModule
    generate(..., cuda_graph=None)      decoding on CUDA: StaticStep, replayed as a CUDA graph, and
                                        the search on the device (fast/beam.py; generate's
                                        fast_search; fast.beam.WHOLE_STEP: the whole step in one
                                        graph, on by default)
    fast.use_triton_bias(model)         fast/triton_bias.py's Triton kernel on the flex path
    fast.use_triton_additive(model)     PALM's copy scores by fast/triton_additive.py (Triton)
Objectives, notebooks and exercises never import this file.

Pieces, their readable twins and the tests that hold them equal:
    BucketBias                 RelativePositionBias.lookup        tests/test_fast.py
    FlexBias, mask_mod         RelativePositionBias, attention_mask   tests/test_attention_paths.py
    encode_flex, flex          Transformer.encode, naive_attention  tests/test_attention_paths.py
    compiled_additive_scores   model.additive_scores                bench/check_cuda.py (GPU only)
    compile_blocks             the eager blocks                     bench/check_cuda.py (GPU only)
    StaticCache, StaticStep    model.KVCache, Decoder.logprobs      tests/test_fast.py
    plan_packing, Packed       the model on one passage a row       tests/test_packing.py
    GraphedStep                the eager StaticStep                 tests/test_fast.py, check_cuda
    beam_search, greedy        generate.beam_search, generate.greedy  tests/test_fast_beam.py
                               (fast/beam.py: no host sync a step)
    WholeStep, StepGraph,      generate.beam_search, greedy,      tests/test_fast_graph_search.py,
    static_ban                 ban_tokens (fast/beam.py: the      check_cuda
                               whole step in one CUDA graph)
    use_triton_bias            Transformer.encode, naive_attention  bench/check_triton.py (CPU:
                               (fast/triton_bias.py)                the interpreter), check_cuda
    use_triton_additive        model.additive_scores                bench/check_triton_additive.py
                               (fast/triton_additive.py)            (CPU: the interpreter), check_cuda
The measurements behind each piece are in bench/RESULTS.md.
Two hand-written Triton files, fast/triton_bias.py (pmlm's relative bias inside the tiles) and
fast/triton_additive.py (PALM's copy scores in tiles, as a matrix product), need triton (not a
requirement of the project). Left out: fused optimizers, FP8, paged caches;
packing across batches (each batch's own passages are packed; the padding left, per objective and
corpus, is measured by bench/padding.py).
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fast.beam import beam_search, greedy  # noqa: F401  (generate.py's switch reaches them here)
from objectives.masks import CTX, ORIG, PAD, PSEUDO, MaskSpec, may_attend

_COMPILED = {}


# --------------------------------------------------------------------------------------------------
# The switch for training


def speed_up(model, compile=True, dynamic=False, copy_scores="auto"):
    """train.py's switch into this layer: on CUDA, the relative bias's BucketBias backward and
    PALM's fast copy scores (copy_scores: fast_copy_scores's way, "auto" by default); with
    compile, torch.compile of every block (any device; dynamic: compile_blocks's). -> model. On a
    CPU without compile it changes nothing (tests/test_fast.py)."""
    if next(model.parameters()).is_cuda:
        if model.rel_bias is not None:
            model.rel_bias.fast_lookup = BucketBias.apply
        if model.copy_head is not None:
            model.copy_head.fast_scores = fast_copy_scores(copy_scores)
    if compile:
        compile_blocks(model, dynamic)
    return model


def compile_blocks(model, dynamic=False):
    """torch.compile each Transformer block (regional compilation): the blocks are alike, so one
    compilation serves them all, in a fraction of the time of compiling the whole model; embeddings
    and heads stay eager. Twin: the eager blocks (bench/check_cuda.py compares them on a GPU)."""
    # dynamic=False compiles once per shape, and past the recompile limit runs new shapes
    # uncompiled: PALM's 9 lengths went past dynamo's default limit of 8 (on an H200, train.py's
    # loop at 0.79 of the bare step), the study's ERNIE-GEN pre-training, whose count of rows
    # changes with the examples it skips, compiled 23 times in 200 steps (bench/RESULTS.md,
    # seventh session). train.py compiles with dynamic=True: once, for any shape
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    # Under DDP, dynamo's DDPOptimizer cuts every graph it compiles inside DDP's forward at DDP's
    # 25 MB gradient buckets: a base block (28 MB of fp32 weights) became two graphs, twice the
    # calls and less fusion, and train.py under torchrun with one process ran at 0.87 of one GPU
    # alone (bench/RESULTS.md, seventeenth session). Compiled one block at a time, the gradients
    # already come block by block, where DDP's reducer starts its all-reduces: nothing to cut
    torch._dynamo.config.optimize_ddp = False
    for block in model.blocks:
        block.compile(dynamic=dynamic)
    return model


# --------------------------------------------------------------------------------------------------
# Relative position bias: a backward made for a GPU


class BucketBias(torch.autograd.Function):
    """bias[b, h, i, j] = table[bucket[b, i, j], h], with a backward made for a GPU.

    Twin: model.RelativePositionBias.lookup (index_select), the same bias and table gradient
    (tests/test_fast.py: exactly, and float64 gradcheck; bench/check_cuda.py on a GPU).
    The plain lookup's backward adds B * Lq * Lk gradient rows into a 32-row table one by one
    (atomic adds on 32 x H addresses: 12 ms a step for UniLMv2 at base size on an H100, measured
    by bench/profile_step.py). Here the sum per bucket is a matrix product with a one-hot matrix,
    in chunks of rows so the GPU has work for every core:
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


# --------------------------------------------------------------------------------------------------
# FlexAttention: the mask as tiles, the bias as a score_mod


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
    copies' gradients are summed by expand's backward (127 ms; bench/profile_step.py).
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


def flex(q, k, v, mask, bias):
    """model.attention's "flex" path: q, k, v (B, H, L, D), mask a block_mask, bias a FlexBias or
    None -> (B, H, L, D). Twin: model.naive_attention. FlexAttention has no dropout on the attention
    weights, so this path has none (the residual and embedding dropout stay)."""
    # use_triton_bias: the mask is triton_bias.Inputs (mask and bias), its attend the kernel
    if hasattr(mask, "attend"):
        return mask.attend(q, k, v)
    score_mod = bias.score_mod() if bias is not None else None
    return flex_attention()(q, k, v, score_mod=score_mod, block_mask=mask)


def encode_flex(model, x, position_ids, spec: MaskSpec):
    """Transformer.encode on the FlexAttention path: one block mask and one score_mod (the relative
    bias) shared by every layer. Twin: Transformer.encode with the dense mask
    (tests/test_attention_paths.py)."""
    # use_triton_bias: triton_bias's kernel instead of FlexAttention
    if getattr(model, "triton_bias", False):
        from fast import triton_bias
        return triton_bias.encode(model, x, position_ids, spec)
    if x.device.type != "cuda" and torch.is_grad_enabled():
        raise RuntimeError("attn_impl=flex trains on CUDA only (FlexAttention has no backward "
                           "on a CPU); use sdpa here")
    mask = block_mask(spec, x.device)
    bias = FlexBias.of(model.rel_bias, position_ids) if model.rel_bias is not None else None
    for block in model.blocks:
        x = block(x, mask, bias)
    return model.ln_f(x)


# --------------------------------------------------------------------------------------------------
# Packing: several passages in one row, so that the blocks compute (almost) no padding


def pack_rows(lengths, width):
    """Best-fit decreasing bin packing: the longest passage first, each into the row with the least
    room that still holds it (a new row if none does). -> ([(row, offset)] per length, rows)."""
    order = sorted(range(len(lengths)), key=lambda b: -lengths[b])   # stable: ties keep their order
    room = []                                                         # free slots of each row
    place = [None] * len(lengths)
    for b in order:
        fits = [r for r in range(len(room)) if room[r] >= lengths[b]]
        if not fits:
            room.append(width)
            fits = [len(room) - 1]
        r = min(fits, key=lambda r: room[r])
        place[b] = (r, width - room[r])
        room[r] -= lengths[b]
    return place, len(room)


def key_cost(model):
    """Attention's training FLOPs per token and per key it attends, over the rest of a token's FLOPs
    (model.estimate_flops = rest + key_cost * rest * width): what a wider packed row costs. On the
    flex path nothing: FlexAttention skips the tiles between passages."""
    if model.config.attn_impl == "flex":
        return 0.0
    rest = model.estimate_flops(0)
    return (model.estimate_flops(1) - rest) / rest


def pack_width(lengths, multiple=1, key_cost=0.0, max_padding=None):
    """The row width for packing these lengths: the cheapest of the widths from the longest length
    (rounded up to `multiple`) to twice that, by rows * width * (1 + key_cost * width), the blocks'
    FLOPs with dense attention. The rows' total room rarely matches the tokens: a width a little
    wider than the longest passage often saves a row (most of the padding left on a corpus of short
    passages is the last row's). max_padding: the cheapest of the widths whose rows are at most this
    share padding (the one with the fewest slots where none is)."""
    first = -(-max(lengths) // multiple) * multiple
    step = max(multiple, 8)
    widths = range(first, 2 * first + 1, step)
    slots = {width: pack_rows(lengths, width)[1] * width for width in widths}
    if max_padding is not None:
        fits = [width for width in widths if 1 - sum(lengths) / slots[width] <= max_padding]
        widths = fits or [min(widths, key=slots.get)]
    return min(widths, key=lambda width: slots[width] * (1 + key_cost * width))


def plan_packing(batch, multiple=1, key_cost=0.0, width=None, max_padding=None):
    """The packing of a Batch, computed on the CPU (where the batch is built): its passages go into
    rows of pack_width (or of `width`, widened to the longest passage), several to a row. -> the
    Batch with three extras: "pack_tokens" (N,) where its N real tokens are in the batch flattened
    (B * L), "pack_slots" (N,) where they go in the packed rows flattened (rows * width), and
    "pack_shape" (rows, width). The batch itself stays as the objective made it: `packed` packs it
    for the blocks and unpacks their output."""
    if len(batch) == 0:
        return batch
    real = batch.kind != PAD                                            # (B, L)
    lengths = real.sum(1).tolist()
    if width is None:
        width = pack_width(lengths, multiple, key_cost, max_padding)
    width = max(width, -(-max(lengths) // multiple) * multiple)
    place, rows = pack_rows(lengths, width)
    first = torch.tensor([r * width + offset for r, offset in place])  # (B,) a passage's 1st slot
    # the real tokens of a passage keep their order, one slot after the other (PALM's gap closes)
    slot = first[:, None] + real.long().cumsum(1) - 1                   # (B, L)
    batch.extras.update(pack_tokens=real.flatten().nonzero().squeeze(1), pack_slots=slot[real],
                        pack_shape=(rows, width))
    return batch


class SteadyPacking:
    """plan_packing for compiled blocks (train.py --pack on CUDA): every batch in rows of ONE width,
    the widest passage seen yet rounded up to `multiple` (it settles within the first batches: most
    pre-training passages are full), so only the count of rows changes from batch to batch, and
    the blocks compiled for any shape (train.py: dynamic=True) compile once (plan_packing's own
    width, cheapest per batch, gave 14-38 (rows, width) shapes in 150 batches, each a compilation
    where shapes were static). The price: a few slots more padding than the cheapest width.
    Twin: plan_packing (tests/test_packing.py: the same rows for the same width)."""

    def __init__(self, multiple=64):
        self.multiple = multiple
        self.width = 0

    def __call__(self, batch):
        batch = plan_packing(batch, self.multiple, width=self.width)
        self.width = max(self.width, batch.extras.get("pack_shape", (0, 0))[1])
        return batch


class Packing(NamedTuple):
    """Where a batch's real tokens go in its packed rows (plan_packing's extras)."""
    tokens: torch.Tensor          # (N,) positions in the batch flattened, (B * L)
    slots: torch.Tensor           # (N,) slots in the packed rows flattened, (rows * width)
    shape: tuple                  # (rows, width)

    @classmethod
    def of(cls, batch):
        x = batch.extras
        return cls(x["pack_tokens"], x["pack_slots"], x["pack_shape"])

    def pack(self, x, fill):
        """(B, L) in the objective's layout -> (rows, width) packed; the empty slots get fill."""
        out = x.new_full((self.shape[0] * self.shape[1],), fill)
        return out.index_put((self.slots,), x.flatten()[self.tokens]).view(self.shape)

    def unpack(self, y, batch_shape):
        """(rows, width, d) packed -> batch_shape + (d,) in the objective's layout; padding zeros.
        Every index once (no padding row gathers many slots): a backward without collisions."""
        flat = y.flatten(0, 1)[self.slots]                                  # (N, d)
        out = flat.new_zeros(batch_shape[0] * batch_shape[1], y.size(-1))
        return out.index_put((self.tokens,), flat).view(*batch_shape, y.size(-1))


class Packed:
    """The model seen through a packed batch: model(input_ids, position_ids, segment_ids, mask) in
    the objective's layout packs the inputs, runs the model on the packed rows and unpacks its
    output; everything else (heads, parameters) is the model's own. The objectives never know.

    Twin: the model on the unpacked batch (tests/test_packing.py: the same per-token losses for
    every objective, float64, naive and sdpa). Exact because each passage keeps its own position ids
    (they restart at every passage, and so do the relative bias's buckets, which read them) and the
    mask gains "and only its own passage" (masks.attention_mask's passage; fast.mask_mod's too).
    """

    def __init__(self, model, packing: Packing):
        self.model = model
        self.packing = packing

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, input_ids, position_ids, segment_ids, mask: MaskSpec):
        p = self.packing
        B, L = input_ids.shape
        passage = torch.arange(B, device=input_ids.device)[:, None].expand(B, L)
        spec = MaskSpec(p.pack(mask.kind, PAD), p.pack(mask.step, 0), p.pack(passage, -1))
        h = self.model(p.pack(input_ids, 0), p.pack(position_ids, 0), p.pack(segment_ids, 0),
                       spec)                                            # (rows, width, d)
        return p.unpack(h, (B, L))                                      # (B, L, d)


def packed(model, batch):
    """The model to hand objective.loss for this batch: a Packed view where plan_packing packed it,
    else the model itself (train.py's LossModule)."""
    if "pack_shape" not in batch.extras:
        return model
    return Packed(model, Packing.of(batch))


# --------------------------------------------------------------------------------------------------
# The switch into fast/triton_bias.py: a Triton flash attention with the relative bias


def use_triton_bias(model, on=True):
    """Run the model's attention through fast/triton_bias.py's Triton kernel (the mask rule and
    the relative position bias inside the tiles, the bias gradient reduced per tile): the "flex"
    path's encode_flex hands every block that kernel's inputs. CUDA, or a CPU under Triton's
    interpreter (TRITON_INTERPRET=1, slow: tests only). Needs triton, which the project does not
    require. Twin: Transformer.encode on the naive path (bench/check_triton.py; bench/check_cuda.py
    on a GPU). -> model."""
    if on:
        from fast import triton_bias                    # noqa: F401  (fails here without triton)
        model.config.attn_impl = "flex"
    model.triton_bias = on
    return model


# --------------------------------------------------------------------------------------------------
# PALM's copy scores, fused


def compiled_additive_scores():
    """model.additive_scores compiled (its twin; bench/check_cuda.py compares values and gradients
    on a GPU): one fused kernel that never writes the (B, T, S, d) tensor and recomputes the tanh in
    backward, what makes PALM's copy head cheap on a GPU."""
    from model import additive_scores
    if "scores" not in _COMPILED:
        _COMPILED["scores"] = torch.compile(additive_scores, dynamic=True)
    return _COMPILED["scores"]


def fast_copy_scores(way="auto"):
    """PALM's copy scores on a GPU: "compiled" (compiled_additive_scores), "triton"
    (fast/triton_additive.py), or "auto": Triton's where triton imports, on a GPU of compute
    capability 8.0 or more (timed and checked on sm_90 only), for a full tile of target rows or more
    (training: a PALM step at base size 45.9 ms against 56.2 ms compiled on an H200), the compiled
    function for fewer (decoding's one row a beam: beam 5 took 0.360 s a batch with Triton's tiles,
    0.277 s compiled; bench/RESULTS.md, twelfth session)."""
    if way not in ("auto", "triton", "compiled"):
        raise ValueError(f"copy_scores {way!r}: auto, triton or compiled")
    compiled = compiled_additive_scores()
    cuda = torch.cuda.is_available()
    older_gpu = way == "auto" and cuda and torch.cuda.get_device_capability() < (8, 0)
    if way == "compiled" or older_gpu:
        return compiled
    try:
        from fast import triton_additive
    except ImportError:
        if way == "triton":
            raise
        return compiled
    if way == "triton":
        return triton_additive.additive_scores
    rows = triton_additive.FORWARD[0]

    def scores(hm, ws, w):
        return (triton_additive.additive_scores if ws.size(1) >= rows else compiled)(hm, ws, w)
    return scores


def use_triton_additive(model, on=True):
    """Compute PALM's copy scores (Eq. 3) with fast/triton_additive.py's Triton kernels (tiles of
    scores, as a matrix product: hm and ws read once a tile, not once a (t, j) pair), as speed_up
    does for training on CUDA where triton imports. CUDA, or a CPU under Triton's interpreter
    (TRITON_INTERPRET=1, slow: tests only). Needs triton, which the project does not require. Twin:
    model.additive_scores (bench/check_triton_additive.py; bench/check_cuda.py on a GPU). -> model;
    off: the readable function again."""
    if model.copy_head is not None:
        if on:
            from fast import triton_additive                # fails here without triton
            model.copy_head.fast_scores = triton_additive.additive_scores
        else:
            model.copy_head.fast_scores = None
    return model


# --------------------------------------------------------------------------------------------------
# Decoding with static shapes, replayed as a CUDA graph


class StaticCache:
    """model.KVCache (its twin) with preallocated buffers (N, H, capacity, D) per layer and every
    shape fixed, which a CUDA graph needs.

    model.KVCache concatenates, which copies the whole cache in every layer at every step (on an
    H100 that was 3/4 of the decoding time at base size). Here the new keys, values and positions
    are written at the fill index, a DEVICE tensor that commit() advances in place, and every layer
    attends to the WHOLE buffer: the step's mask hides the slots not written yet. `n` is the same
    count on the host, for the bookkeeping outside the step (len, beam reorders). A beam reorder
    that keeps every row with its source (`same_sources`) moves only the target part: the beams of
    one source share the source's keys and values.

    group_beams(K) (fast/beam.py's WholeStep, beam search) turns it into one row a SOURCE: the
    source's slots once, then K columns of target slots side by side (column k's at S + k T, T =
    capacity - S). The K beams' new columns are then K n columns of their source's row (StaticStep
    groups them), and a step reads the source's keys once instead of K times. A beam reorder then
    moves nothing: column k's slot of step s, written at step s, is never written again, so a
    beam's history is a list of columns, one a step (`anc`, its ancestors), and its queries see the
    slots that list names (sees()). One row a beam copies every target slot at every reorder.
    """

    def __init__(self, n_layer, capacity, n_src, device):
        self.k = [None] * n_layer            # each (N, H, capacity, D)
        self.v = [None] * n_layer
        self.pos = None                      # (N, capacity) position id of every slot
        self.capacity = capacity
        self.n_src = n_src
        self.n = 0
        self.fill = torch.zeros((), dtype=torch.long, device=device)
        self.slots = None
        self.beams = 1                       # K beams a row (group_beams): column k's slots at S + k T
        self.T = capacity - n_src            # target slots of one column (with the query's)

    def group_beams(self, K):
        """One row a source from here on, rows (B, H, S + K T, D): the source's keys and values,
        written already, stay in place; K columns of target slots follow (empty, as every target
        slot is before a beam search's first step), column k first written by beam k."""
        assert self.n == self.n_src, "group_beams: before the first target token only"
        self.beams = K
        self.capacity = self.n_src + K * self.T
        wider = (K - 1) * self.T
        self.k = [F.pad(b, (0, 0, 0, wider)) for b in self.k]
        self.v = [F.pad(b, (0, 0, 0, wider)) for b in self.v]
        self.pos = F.pad(self.pos, (0, wider))
        # anc[b, k, s]: the column holding beam k's target slot s (its own, until a reorder)
        own = torch.arange(K, device=self.fill.device)[:, None]                      # (K, 1)
        self.anc = own.expand(self.k[0].size(0), K, self.T).contiguous()             # (B, K, T)

    def sees(self, slots):
        """Which slots the queries at `slots` (K n,) of a grouped row may see for their beam:
        the source's, and of the target slots the one its history names at each step ->
        (B, K n, capacity) bool."""
        S, T = self.n_src, self.T
        j = torch.arange(self.capacity, device=slots.device)
        column, step_slot = (j - S).clamp(min=0) // T, (j - S).clamp(min=0) % T  # (capacity,)
        anc = self.anc[:, (slots - S) // T]                                       # (B, K n, T)
        named = anc.gather(2, step_slot.expand(*anc.shape[:2], -1)) == column    # (B, K n, capacity)
        return named | (j < S)

    def new_slots(self, n):
        """The slots of this step's n new columns of each beam, beam-major (K n,): fill, fill + 1,
        ... in column 0's target slots, the same in column 1's (T further), ... (beam k writes
        column k)."""
        cols = self.fill + torch.arange(n, device=self.fill.device)                  # (n,)
        beam = torch.arange(self.beams, device=self.fill.device)[:, None] * self.T  # (K, 1)
        return (cols[None] + beam).flatten()

    def __len__(self):
        return self.n

    def key_positions(self, position_ids):
        """Write the new tokens' positions (N, L) at their slots -> every slot's position
        (N, capacity). encode calls this once, before the layers."""
        if self.pos is None:
            self.pos = position_ids.new_zeros(position_ids.size(0), self.capacity)
        # this forward's slots: fill, fill + 1, ... (of each beam, grouped)
        self.slots = self.new_slots(position_ids.size(1) // self.beams)
        self.pos.index_copy_(1, self.slots, position_ids)
        return self.pos

    def layer(self, i, k_new, v_new):
        if self.k[i] is None:
            shape = (*k_new.shape[:2], self.capacity, k_new.size(3))
            self.k[i] = k_new.new_zeros(shape)
            self.v[i] = k_new.new_zeros(shape)
        # written in place, uncommitted until commit()
        self.k[i].index_copy_(2, self.slots, k_new)
        self.v[i].index_copy_(2, self.slots, v_new)
        return self.k[i], self.v[i]                                # (N, H, capacity, D)

    def commit(self, n):
        # keys, values and positions are already in place; a dropped query's slot is overwritten
        # by the next step
        self.n += n
        self.fill += n

    def reorder(self, index, same_sources=False, static=False):
        """Beam search: keep batch rows `index` (N',). static (with same_sources): move every target
        slot, written or not, so that the shapes never change (fast/beam.py's whole-step graph,
        where the host's count n does not follow the steps); the slots past the fill index are
        overwritten before any step reads them."""
        if self.beams > 1 and not same_sources:
            # the rows becoming beams (generate.start_beams): a grouped row holds them already
            assert self.n == self.n_src, "a grouped cache keeps every source"
            return
        if self.beams > 1:
            # one row a source: beam k of source b continues beam index[b K + k] % K; nothing
            # moves, beam k takes that beam's history of columns
            assert static, "a grouped cache keeps its shapes"
            K, T = self.beams, self.T
            take = (index % K).view(-1, K, 1).expand(-1, -1, T)                  # (B, K, T)
            anc = self.anc.gather(1, take)
            # the slots from the fill index on are written from now on, each beam in its own column
            ahead = torch.arange(T, device=index.device) >= self.fill - self.n_src   # (T,)
            own = torch.arange(K, device=index.device)[:, None]
            self.anc.copy_(torch.where(ahead, own, anc))
            return
        if same_sources:
            # only the target part differs between the beams of one source
            end = self.capacity if static else self.n
            for buf in self.k + self.v:
                buf[:, :, self.n_src:end] = buf[:, :, self.n_src:end].index_select(0, index)
            return
        self.k = [b.index_select(0, index) for b in self.k]
        self.v = [b.index_select(0, index) for b in self.v]
        self.pos = self.pos.index_select(0, index)


class GraphedStep:
    """fn(*inputs) -> tensor, recorded once as a CUDA graph and replayed: one launch for a whole
    decoding step instead of one per kernel (at base size several hundred kernels, whose launches
    cost the CPU milliseconds for well under a millisecond of GPU work). Twin: fn run eagerly
    (tests/test_fast.py stands an eager fn in for the graph; bench/check_cuda.py replays it).

    torch.cuda.graph's documented pattern: fn runs once on a side stream first (cuBLAS handles,
    autotuning, torch.compile happen outside the capture), then it is captured on static copies of
    the inputs. A call copies its inputs into them, replays, and returns a copy of the static
    output; fn's writes into the cache replay too. The graph holds the addresses of every tensor fn
    reads or writes: it is valid only while none of them is reallocated (StaticStep.reorder).
    """

    def __init__(self, fn, *inputs):
        with torch.cuda.device(inputs[0].device):
            self.inputs = [x.clone() for x in inputs]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=side):
                self.output = fn(*self.inputs)

    def __call__(self, *inputs):
        for static, x in zip(self.inputs, inputs):
            static.copy_(x)
        self.graph.replay()
        return self.output.clone()


def slot_mask(q_kind, q_step, q_slot, k_kind, k_step):
    """masks.may_attend between queries (N, n) at cache slots q_slot (n,) and every slot of the
    cache (N, capacity) -> (N, n, capacity). A padding query sees its own slot (as mask_mod)."""
    j = torch.arange(k_kind.size(1), device=k_kind.device)
    same = (q_slot[:, None] == j)[None]                                 # (1, n, capacity)
    allowed = may_attend(q_kind[..., None], q_step[..., None],          # queries (N, n, 1)
                         k_kind[:, None], k_step[:, None], same)        # keys (N, 1, capacity)
    return allowed | ((q_kind == PAD)[..., None] & same)


class StaticStep:
    """generate.Decoder's cached step with every shape fixed, replayed as a CUDA graph where
    `graphed`. Twin: Decoder.logprobs on model.KVCache (tests/test_fast.py: the same tokens and
    scores for all four objectives, greedy and beam; bench/check_cuda.py with the graph on a GPU).

    The cache is a StaticCache of capacity S + max_len + 1 (source, target, query). A step's new
    columns ([y_{t-1}, query] or [y_{t-1}]) are described by kind and step per cache slot, the same
    description generate.Decoder gives the readable path, and masks.may_attend makes their mask;
    nothing the step runs reads a Python number that changes from step to step. Embedding runs
    outside the graph; beam reorders and the search stay outside too, unless the search is
    fast/beam.py's WholeStep, which calls step() inside its own graph of the whole search step.
    """

    def __init__(self, dec, max_len, graphed):
        self.cache = StaticCache(dec.model.config.n_layer, dec.S + max_len + 1, dec.S,
                                 dec.src_ids.device)
        self.graphed = graphed
        self.graph = None                      # the GraphedStep, captured at the first graphed step

    def slot_kinds(self, dec, last):
        """kind and step (N, capacity) of every cache slot while slot `last` (a device scalar) is
        the newest column: the source's, the target's written so far, the query at `last`. On a
        grouped cache (K columns of target slots a row): (B, capacity), each target slot as the
        slot it is in its column, `last` the newest in column 0."""
        cache, K = self.cache, self.cache.beams
        j = torch.arange(cache.capacity, device=dec.src_ids.device)
        src_len = dec.src_len[::K]                                      # (N / K,) one a source
        kind = torch.where(j < src_len[:, None], CTX, PAD)             # (N / K, capacity)
        j = torch.where(j >= dec.S, dec.S + (j - dec.S) % cache.T, j)
        target = (j >= dec.S) & (j <= last)
        kind = torch.where(target, ORIG, kind)
        if dec.query is not None:
            kind = torch.where(target & (j == last), PSEUDO, kind)
        # target slot S + i holds the token of step i + 1 (generate.Decoder._layout)
        step = (j - dec.S + 1).clamp(min=0).expand_as(kind)
        return kind, step

    def encode_source(self, dec):
        """The source's pass, into the cache -> its final-layer states (N, S, d)."""
        ids, pos, seg, _ = dec._inputs(0, with_target=False)
        last = torch.tensor(dec.S - 1, device=ids.device)
        kind, step = self.slot_kinds(dec, last)
        cols = torch.arange(dec.S, device=ids.device)
        mask = slot_mask(kind[:, :dec.S], step[:, :dec.S], cols, kind, step)
        h = dec.model(ids, pos, seg, mask, cache=self.cache)
        self.cache.commit(dec.S)
        return h

    def logprobs(self, dec):
        """Decoder.logprobs with static shapes: the new columns' inputs are built from the cache's
        fill index, src_len and the last tokens, not from the whole sequence; step() runs them,
        replayed as a CUDA graph from the second step on where self.graphed."""
        # the target columns not in the cache yet: [y_{t-1}, query] ([query] alone at t = 0), or
        # [y_{t-1}] ([SOS] at t = 0)
        ids = dec._target_part()[:, len(self.cache) - dec.S:]                 # (N, n_new)
        # embedded outside the graph (as measured; embed's position check, which reads the GPU
        # and so cannot be captured, runs on CPU tensors only)
        x, pos, cols = self.new_columns(dec, ids)
        step = lambda x, pos, cols: self.step(dec, x, pos, cols)
        # t = 0 runs eagerly: with a query token it has one column fewer than the later steps
        if self.graphed and dec.tgt.size(1) > 0:
            if self.graph is None:
                self.graph = GraphedStep(step, x, pos, cols)
            logp = self.graph(x, pos, cols)
        else:
            logp = step(x, pos, cols)
        # y_{t-1} joins the cache; the query token is dropped
        self.cache.commit(ids.size(1) - (dec.query is not None))
        return logp

    def new_columns(self, dec, ids):
        """The new columns' token ids (N, n_new) -> their embeddings (N, n_new, d), positions
        (N, n_new) and cache slots (n_new,), from the cache's fill index and src_len alone."""
        cols = self.cache.fill + torch.arange(ids.size(1), device=ids.device)  # (n_new,) slots
        # a target token of step r (slot S + r - 1) sits at position S_b + r - 1
        pos = dec.src_len[:, None] + (cols - dec.S)                            # (N, n_new)
        return dec.model.embed(ids, pos, torch.full_like(ids, dec.seg_tgt)), pos, cols

    def step(self, dec, x, pos, cols):
        """The blocks over the embedded new columns x (N, n_new, d) at positions pos (N, n_new) and
        cache slots cols (n_new,), attending to the whole cache, then decode_logprobs -> (N, V).
        Every shape is the same at every step (GraphedStep records this)."""
        kind, step = self.slot_kinds(dec, cols[-1])
        K = self.cache.beams
        if K > 1:
            # one row a source: the K beams' new columns are K n columns of their source's row
            N, n, d = x.shape
            x, pos = x.reshape(N // K, K * n, d), pos.reshape(N // K, K * n)
            cols = self.cache.new_slots(n)                                     # (K n,)
        # (N, n_new, capacity); grouped: (B, K n_new, capacity)
        mask = slot_mask(kind[:, cols], step[:, cols], cols, kind, step)
        if K > 1:
            # a beam sees the source and, of the target slots, its own history's
            mask &= self.cache.sees(cols)
        h = dec.model.encode(x, pos, mask, self.cache)                         # (N, n_new, d)
        h = h.reshape(-1, h.size(1) // K, h.size(2))                           # one row a beam
        return dec.objective.decode_logprobs(dec.model, h[:, -1], dec.source)

    def reorder(self, index, same_sources):
        self.cache.reorder(index, same_sources)
        if not same_sources and self.graph is not None:
            # Sources finished: the cache was reallocated under the graph, so the graph goes and
            # the step runs eagerly (the same numbers) from here on. Rows only ever leave, so a
            # graph is never replayed once its rows change, and a new graph per set of rows costs a
            # warm-up step plus a capture at every change: a loss when sources finish a step or two
            # apart. Eagerly, a batch costs at most one capture (min_len = max_len keeps every row).
            self.graph = None
            self.graphed = False

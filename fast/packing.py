"""Packing: several passages in one row (train.py --pack true), so that the blocks compute (almost)
no padding. The objectives never know: `packed(model, batch)` hands their loss a view of the model
that packs its inputs and unpacks its output. Twin: the model on one passage a row
(tests/test_packing.py: the same per-token losses for every objective).
Left out: packing across batches (each batch's own passages are packed; the padding left, per
objective and corpus, is measured by bench/padding.py).
"""
from typing import NamedTuple

import torch

from objectives.masks import PAD, MaskSpec


def round_up(n, multiple):
    """n rounded up to a multiple of `multiple` (-(-a // b): ceil division)."""
    return -(-n // multiple) * multiple


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
    first = round_up(max(lengths), multiple)
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
    Batch with four extras: "pack_tokens" (N,) where its N real tokens are in the batch flattened
    (B * L), "pack_slots" (N,) where they go in the packed rows flattened (rows * width),
    "pack_shape" (rows, width), and "pack_free" a slot no token goes to (None if every slot is
    taken; fast/train_graph.py's padding needs one). The batch itself stays as the objective made
    it: `packed` packs it for the blocks and unpacks their output."""
    if len(batch) == 0:
        return batch
    real = batch.kind != PAD                                            # (B, L)
    lengths = real.sum(1).tolist()
    if width is None:
        width = pack_width(lengths, multiple, key_cost, max_padding)
    width = max(width, round_up(max(lengths), multiple))
    place, rows = pack_rows(lengths, width)
    first = torch.tensor([r * width + offset for r, offset in place])  # (B,) a passage's 1st slot
    # the real tokens of a passage keep their order, one slot after the other (PALM's gap closes)
    slot = first[:, None] + real.long().cumsum(1) - 1                   # (B, L)
    # a row's passages fill it from its first slot on: its last slot is free if they leave room
    used = [0] * rows
    for (r, _), n in zip(place, lengths):
        used[r] += n
    free = next((r * width + width - 1 for r in range(rows) if used[r] < width), None)
    batch.extras.update(pack_tokens=real.flatten().nonzero().squeeze(1), pack_slots=slot[real],
                        pack_shape=(rows, width), pack_free=free)
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

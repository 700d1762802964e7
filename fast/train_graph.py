"""The training step's forward, loss and backward replayed as a CUDA graph, at a steady shape.

At base size a step launches some 900 kernels from Python, and their launches, not the GPU's work,
set the step's time (bench/RESULTS.md, training throughput: the host's time is 98-100% of the
wall). A CUDA graph launches them all at once. A graph replays fixed shapes only, so every batch is
padded to one steady shape (StaticShapes): its rows plus one padding row, a width, and for every
kind of labelled row a count, each only growing (to a multiple); a packed batch (fast.SteadyPacking)
its own count of packed rows, their width and a token index a slot. So a run settles on a few
shapes in its first batches and captures a graph for each (and for each value of the batch's
Python extras, such as UniLM's LM type). The padding changes no loss: no real token sees a
padding token (the mask rule), padding carries label -100, and the labelled counts above the real
ones index the last row, padding, whose labels the cross-entropy ignores (objectives.lm_loss); the
spare token indices of a packing move the last row's last token, padding, into a free slot of the
packed rows (a padding token of a passage of its own: no real token sees it).

Twin: LossModule's forward and loss.backward() run eagerly on the unpadded batch
(bench/check_cuda.py graph: the same loss and gradients; tests/test_fast.py: the padded batch gives
the unpadded one's loss, metrics and gradients). The gradients are ADDED into every parameter's
.grad, views of one buffer allocated once outside the graphs, as an eager backward adds them; the
optimizer step, the clip and zero_grad(set_to_none=False) stay outside the graph. Under torchrun
no DDP wrapper runs (its hooks act outside a replay): after a step's micro-batches all_reduce
averages that one buffer over the processes in one call. train.py --graph true uses it;
bench/bench_train.py --graph measures it. Left out: the optimizer step inside the graph, fp16's
loss scaler, the all-reduce overlapping the backward (bench/RESULTS.md, training throughput).
"""
from typing import NamedTuple

import torch
import torch.distributed as dist

from fast.packing import round_up
from objectives import Batch
from objectives.masks import PAD

# a batch's tensor fields, in Batch's order
FIELDS = ("input_ids", "position_ids", "segment_ids", "labels", "kind", "step")


class Shape(NamedTuple):
    """A steady shape: what pad_batch pads a batch to, and (with the Python extras) a graph's
    key."""
    rows: int                    # examples, plus one padding row
    width: int                   # tokens a row
    counts: tuple                # ((kind, labelled rows), ...)
    packed: tuple = None         # (rows, width, token indices) of a packed batch


class StaticShapes:
    """The steady shape batches are padded to: rows (the most seen, plus one padding row: the spare
    indices of the labelled counts land on its last token), the width (the most seen, rounded up to
    `multiple`) and a count per labelled kind (the most seen, rounded up to 8 x `multiple`: a spare
    labelled row costs only a row of the LM head, a new count a new graph). A packed batch keeps
    its own count of packed rows (no padding row runs the blocks: a graph serves each count), in
    rows of the most seen width, and its token indices grow to one a slot. The most seen only
    grows."""

    def __init__(self, multiple=64):
        self.multiple = multiple
        self.rows = 0
        self.width = 0
        self.counts = {}
        self.packed_width = 0

    def fit(self, batch):
        """Grow to hold batch -> its Shape."""
        self.rows = max(self.rows, len(batch) + 1)
        self.width = max(self.width, round_up(batch.input_ids.size(1), self.multiple))
        for kind, n in (batch.n_labels or {}).items():
            self.counts[kind] = max(self.counts.get(kind, 0), round_up(n, 8 * self.multiple))
        packed = None
        if "pack_shape" in batch.extras:
            rows, width = batch.extras["pack_shape"]
            self.packed_width = max(self.packed_width, round_up(width, self.multiple))
            packed = (rows, self.packed_width, rows * self.packed_width)
        return Shape(self.rows, self.width, tuple(sorted(self.counts.items())), packed)


def pad_batch(batch, shape, pad_id):
    """batch (B, L) -> the same examples in (shape.rows, shape.width): padding tokens (kind PAD,
    label -100) to the right and below, per-example extras padded with -100 (no label), n_labels
    the counts; a packing's extras in shape.packed."""
    rows, width = shape.rows, shape.width
    B, L = batch.input_ids.shape
    fill = dict(input_ids=pad_id, position_ids=0, segment_ids=0, labels=-100, kind=PAD, step=0)

    def padded(x, value):
        if x.dim() == 1:                                   # a per-example extra (B,)
            return torch.cat([x, x.new_full((rows - B,), value)])
        out = x.new_full((rows, width), value)
        out[:B, :L] = x
        return out
    tensors = [padded(getattr(batch, name), fill[name]) for name in FIELDS]
    extras = dict(batch.extras)
    packing = {k: extras.pop(k) for k in PACKING if k in extras}
    extras = {k: padded(v, -100) if torch.is_tensor(v) else v for k, v in extras.items()}
    if packing:
        extras.update(pad_packing(packing, L, shape))
    return Batch(*tensors, extras, dict(shape.counts))


# a packed batch's extras (fast.plan_packing)
PACKING = ("pack_tokens", "pack_slots", "pack_shape", "pack_free")


def pad_packing(packing, L, shape):
    """plan_packing's extras for a batch of width L -> the same packing of the batch padded to
    shape: token indices move to the wider rows, slots to the wider packed rows, and both grow to
    one a slot, the spare ones sending the batch's last token (padding) to a free slot: the last
    slot of the packed rows where they widened, else the packing's own free slot (there are spare
    indices only where a slot is free)."""
    rows, width, n = shape.packed
    tokens, slots = packing["pack_tokens"], packing["pack_slots"]
    old_width = packing["pack_shape"][1]
    # the same token and slot, counted in rows of the new widths
    tokens = tokens // L * shape.width + tokens % L
    slots = slots // old_width * width + slots % old_width
    free = rows * width - 1 if width > old_width else packing["pack_free"]
    spare = n - tokens.numel()
    tokens = torch.cat([tokens, tokens.new_full((spare,), shape.rows * shape.width - 1)])
    slots = torch.cat([slots, slots.new_full((spare,), free if spare else 0)])
    return dict(pack_tokens=tokens, pack_slots=slots, pack_shape=(rows, width))


def extras_key(batch):
    """What of a batch's extras a graph holds as constants: every Python value, and which tensors
    there are."""
    extras = batch.extras.items()
    return tuple(sorted((k, "tensor" if torch.is_tensor(v) else v) for k, v in extras))


class GraphedLoss:
    """loss_module(batch) and its backward, one CUDA graph a steady shape: call(batch) -> (loss,
    metrics) as LossModule gives them (copies: they outlive the next replay), the gradients added
    into .grad. The first batch of a shape runs twice for real on a side stream (compilation,
    cuBLAS handles), then is captured; the gradients are put back as they were before the warm-up,
    and the graph replays that batch."""

    def __init__(self, loss_module, pad_id, dtype=torch.bfloat16, multiple=64, grad_scale=1.0):
        self.loss_module = loss_module
        self.pad_id = pad_id
        self.dtype = dtype
        # what the backward scales the loss by (train.py: 1 / --grad_accum)
        self.grad_scale = grad_scale
        self.shapes = StaticShapes(multiple)
        self.graphs = {}                 # key -> (graph, static batch, loss, metrics)
        self.params = [p for p in loss_module.parameters() if p.requires_grad]
        self.grads = None                # every parameter's .grad, flat (made at the first capture)
        # one memory pool for all the graphs, captured on one stream (the pool reuses a block only
        # on the stream that freed it): a replay's loss and metrics are copied out before the next
        # replay, so one graph's temporaries may overwrite another's outputs
        self.pool = None
        self.stream = None

    def forward_backward(self, batch):
        """The step the graph holds: the loss under autocast (no cast cache: a graph may not keep
        one), and its backward."""
        on = self.dtype != torch.float32
        with torch.autocast("cuda", self.dtype, enabled=on, cache_enabled=False):
            loss, metrics = self.loss_module(batch)
        (loss * self.grad_scale).backward()
        return loss.detach(), metrics

    def flat_grads(self):
        """Every parameter's .grad a view of one buffer (its values kept), made once, before any
        graph and outside their memory pool: the graphs add into it, all_reduce sends it whole."""
        if self.grads is None:
            self.grads = torch.zeros(sum(p.numel() for p in self.params),
                                     device=self.params[0].device, dtype=self.params[0].dtype)
            start = 0
            for p in self.params:
                view = self.grads[start:start + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                start += p.numel()
        return self.grads

    def all_reduce(self):
        """The gradients averaged over torchrun's processes (what DDP's hooks do), in one call."""
        grads = self.flat_grads()
        grads.div_(dist.get_world_size())
        dist.all_reduce(grads)

    def __call__(self, batch):
        shape = self.shapes.fit(batch)
        padded = pad_batch(batch, shape, self.pad_id)
        key = (shape, extras_key(padded))
        if key not in self.graphs:
            self.graphs[key] = self.capture(padded)
        graph, static, loss, metrics = self.graphs[key]
        for name in FIELDS:
            getattr(static, name).copy_(getattr(padded, name))
        for k, v in padded.extras.items():
            if torch.is_tensor(v):
                static.extras[k].copy_(v)
        graph.replay()
        return loss.clone(), {k: v.clone() if torch.is_tensor(v) else v for k, v in metrics.items()}

    def capture(self, batch):
        """The CUDA graph of forward_backward at this batch's shape -> (graph, its static batch,
        loss, metrics)."""
        # the graph adds into gradients that exist before it, outside its memory pool
        before = self.flat_grads().clone()
        static = batch._map(lambda t: t.clone())
        side = self.stream = self.stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward_backward(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool, stream=side):
            loss, metrics = self.forward_backward(static)
        # the warm-up's gradients go; the capture ran nothing
        self.grads.copy_(before)
        return graph, static, loss, metrics

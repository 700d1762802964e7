"""The training step's forward, loss and backward replayed as a CUDA graph, at a steady shape.

At base size a step launches some 900 kernels from Python, and their launches, not the GPU's work,
set the step's time (bench/RESULTS.md, training throughput: the host's time is 98-100% of the
wall). A CUDA graph launches them all at once. A graph replays fixed shapes only, so every batch is
padded to one steady shape (StaticShapes): its rows plus one padding row, a width, and for every
kind of labelled row a count. Each only grows (to a multiple), so a run settles on a few shapes in
its first batches and captures a graph for each (and for each value of the batch's Python extras,
such as UniLM's LM type). The padding changes no loss: no real token sees a padding token (the mask
rule), padding carries label -100, and the labelled counts above the real ones index the last row,
padding, whose labels the cross-entropy ignores (objectives.lm_loss).

Twin: LossModule's forward and loss.backward() run eagerly on the unpadded batch
(bench/check_cuda.py graph: the same loss and gradients; tests/test_fast.py: the padded batch gives
the unpadded one's loss, metrics and gradients). The gradients are ADDED into every parameter's
.grad, allocated once outside the graphs, as an eager backward adds them; the optimizer step, the
clip and zero_grad(set_to_none=False) stay outside the graph. bench/bench_train.py --graph measures
it. Left out: DDP (its hooks run outside a replay), packed rows (their index tensors have no fixed
size), the optimizer step inside the graph, train.py's loop (bench/RESULTS.md, training throughput).
"""
import torch

from objectives import Batch
from objectives.masks import PAD

# a batch's tensor fields, in Batch's order
FIELDS = ("input_ids", "position_ids", "segment_ids", "labels", "kind", "step")


def round_up(n, multiple):
    return -(-n // multiple) * multiple


class StaticShapes:
    """The steady shape batches are padded to: rows (the most seen, plus one padding row: the spare
    indices of the labelled counts land on its last token), the width and a count per labelled
    kind, each the most seen rounded up to `multiple`. Only grows."""

    def __init__(self, multiple=64):
        self.multiple = multiple
        self.rows = 0
        self.width = 0
        self.counts = {}

    def fit(self, batch):
        """Grow to hold batch -> the key of its shape (rows, width, counts)."""
        self.rows = max(self.rows, len(batch) + 1)
        self.width = max(self.width, round_up(batch.input_ids.size(1), self.multiple))
        for kind, n in (batch.n_labels or {}).items():
            self.counts[kind] = max(self.counts.get(kind, 0), round_up(n, self.multiple))
        return self.rows, self.width, tuple(sorted(self.counts.items()))


def pad_batch(batch, rows, width, counts, pad_id):
    """batch (B, L) -> the same examples in (rows, width): padding tokens (kind PAD, label -100) to
    the right and below, per-example extras padded with -100 (no label), n_labels the counts."""
    B, L = batch.input_ids.shape
    fill = dict(input_ids=pad_id, position_ids=0, segment_ids=0, labels=-100, kind=PAD, step=0)

    def padded(x, value):
        if x.dim() == 1:                                   # a per-example extra (B,)
            return torch.cat([x, x.new_full((rows - B,), value)])
        out = x.new_full((rows, width), value)
        out[:B, :L] = x
        return out
    tensors = [padded(getattr(batch, name), fill[name]) for name in FIELDS]
    extras = {k: padded(v, -100) if torch.is_tensor(v) else v for k, v in batch.extras.items()}
    return Batch(*tensors, extras, dict(counts))


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

    def __init__(self, loss_module, pad_id, dtype=torch.bfloat16, multiple=64):
        self.loss_module = loss_module
        self.pad_id = pad_id
        self.dtype = dtype
        self.shapes = StaticShapes(multiple)
        self.graphs = {}                 # key -> (graph, static batch, loss, metrics)

    def forward_backward(self, batch):
        """The step the graph holds: the loss under autocast (no cast cache: a graph may not keep
        one), and its backward."""
        on = self.dtype != torch.float32
        with torch.autocast("cuda", self.dtype, enabled=on, cache_enabled=False):
            loss, metrics = self.loss_module(batch)
        loss.backward()
        return loss.detach(), metrics

    def __call__(self, batch):
        key = (self.shapes.fit(batch), extras_key(batch))
        (rows, width, counts), _ = key
        padded = pad_batch(batch, rows, width, counts, self.pad_id)
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
        params = [p for p in self.loss_module.parameters() if p.requires_grad]
        # the graph adds into gradients that exist before it, outside its memory pool
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        before = [p.grad.clone() for p in params]
        static = batch._map(lambda t: t.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward_backward(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            loss, metrics = self.forward_backward(static)
        # the warm-up's gradients go; the capture ran nothing
        for p, g in zip(params, before):
            p.grad.copy_(g)
        return graph, static, loss, metrics

"""The leakage checker: proof, by autograd, that no prediction can see what it predicts.
report = leakage.check(model, batch), for a batch of any objective and a model in any state:
report.leaks == [] proves it leak-free; report.gradients(b), (predictions, L), is b's heatmap.

A prediction's gradient with respect to an input embedding is exactly 0.0 (masked scores are -inf)
if and only if no path of attention carries that input to it: explicit and implicit leakage
(UniLMv2 3.2) alike. What a prediction may not depend on follows from kind and step, not from the
mask (`forbidden_inputs`). docs/objectives.md ("The leakage checker") says what it cannot see.
"""
from dataclasses import dataclass, field

import torch

from objectives.masks import CTX, ORIG, PAD


def forbidden_inputs(kind, step, row):
    """(L,) bool: the inputs the prediction at `row` of one example (kind, step: (L,)) may not
    depend on: a context row, nothing but context; a row of step b, no ORIG of step >= b but
    itself (those hold its answer and the future)."""
    if kind[row] == CTX:
        return (kind != CTX) & (kind != PAD)
    j = torch.arange(kind.size(0), device=kind.device)
    return (kind == ORIG) & (step >= step[row]) & (j != row)


def dependencies(model, batch, b, rows, attn_mask=None):
    """(len(rows), L): |d prediction(b, row) / d input embedding(b, j)| summed over the embedding
    dimension. attn_mask: a (B, L, L) mask to use instead of the batch's (a student's, say)."""
    mask = batch.attn_mask if attn_mask is None else attn_mask
    was_training = model.training
    model.eval()
    with torch.enable_grad():
        x = model.embed(batch.input_ids, batch.position_ids, batch.segment_ids)
        # a leaf: the input embeddings are what the gradients are taken with respect to
        x = x.detach().requires_grad_(True)
        h = model.encode(x, batch.position_ids, mask)
        out = []
        for row in rows:
            logits = model.lm_logits(h[b, row])
            g = torch.Generator().manual_seed(int(row))
            probe = (logits * torch.randn(logits.shape, generator=g).to(logits)).sum()
            (grad,) = torch.autograd.grad(probe, x, retain_graph=True)
            out.append(grad[b].abs().sum(-1))
    model.train(was_training)
    return torch.stack(out) if out else torch.zeros(0, batch.input_ids.size(1))


@dataclass
class Leak:
    """One forbidden dependency: prediction (example, row) depends on `input` by `gradient`."""
    example: int
    row: int
    input: int
    gradient: float


@dataclass
class Report:
    """What leakage.check found. `leaks` empty = proven leak-free on this batch."""
    rows: dict = field(default_factory=dict)         # example b -> list of its prediction rows
    grads: dict = field(default_factory=dict)        # example b -> (n_pred, L) |gradients|
    forbidden: dict = field(default_factory=dict)    # example b -> (n_pred, L) bool, the rule above
    leaks: list = field(default_factory=list)        # every Leak

    def gradients(self, b):
        return self.grads[b]

    def depends(self, b):
        """(n_pred, L) bool: which inputs each prediction of example b depends on at all."""
        return self.grads[b] > 0

    def __str__(self):
        n = sum(len(r) for r in self.rows.values())
        if not self.leaks:
            return f"leak-free: {n} predictions, no forbidden dependency"
        first = self.leaks[0]
        return (f"{len(self.leaks)} forbidden dependencies among {n} predictions; first: example "
                f"{first.example}, row {first.row} depends on input {first.input} "
                f"(|grad| {first.gradient:.3g})")


def check(model, batch, examples=None, max_rows=None, attn_mask=None):
    """Every prediction of the batch (labels != -100): what it depends on, and the forbidden
    dependencies. examples: which to check (default all); max_rows: at most that many predictions
    an example; attn_mask: a mask to use instead of the batch's own."""
    report = Report()
    for b in (range(len(batch)) if examples is None else examples):
        rows = (batch.labels[b] != -100).nonzero().flatten().tolist()[:max_rows]
        grads = dependencies(model, batch, b, rows, attn_mask)
        bad = (torch.stack([forbidden_inputs(batch.kind[b], batch.step[b], r) for r in rows])
               if rows else torch.zeros_like(grads, dtype=torch.bool))
        report.rows[b] = rows
        report.grads[b] = grads
        report.forbidden[b] = bad
        for k, j in (bad & (grads > 0)).nonzero().tolist():
            report.leaks.append(Leak(b, rows[k], j, float(grads[k, j])))
    return report


def reachable(mask, n_layers):
    """(B, L, L) -> (B, L, L): which inputs can reach each query through n_layers of attention,
    the mask's matrix power (diagonal: the residual stream); `dependencies` finds these or fewer."""
    m = mask | torch.eye(mask.size(-1), dtype=torch.bool, device=mask.device)
    r = m.clone()
    for _ in range(n_layers - 1):
        r = (r.float() @ m.float() > 0)
    return r

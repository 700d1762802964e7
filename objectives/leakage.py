"""The leakage checker: proof, by autograd, that no prediction can see what it predicts.

    from objectives import leakage
    report = leakage.check(model, batch)          # a batch of any objective, a model in any state
    assert report.leaks == []                     # empty: proven leak-free on this batch
    report.gradients(b)                           # (predictions, L): how much each prediction of
                                                  # example b depends on each input (a heatmap for
                                                  # the notebooks)

A mask can be wrong in two ways the papers warn about (UniLMv2 3.2): EXPLICIT leakage, a query sees
its own answer, and IMPLICIT leakage, a query sees a token that has seen the answer (a context token
attending an appended original, say). A one-layer look at the mask catches the first; the second
runs through the layers. Autograd catches both: the gradient of a prediction with respect to an
input embedding is exactly 0.0 (not small: masked scores are -inf, so their softmax weight and its
gradient are exact zeros) if and only if no path of attention carries that input to the prediction.

Which inputs a prediction must not depend on follows from the batch's own per-token description
(kind, step; objectives/masks.py), not from its mask, so a wrong mask cannot hide its own mistake.
For a prediction at row i:

    row i is context (CTX)          it may not depend on any non-context input: the context is
                                    the corrupted text and nothing else (MLM, UniLMv2's L_AE,
                                    PALM's stage 1, a UniLM source)
    row i is of step b (ORIG, PSEUDO, SPAN: step[i] = b)
                                    it may not depend on an ORIG input of step >= b other than
                                    itself: the originals of its own and later steps hold its
                                    answer and the future

Inputs that carry no text ([P], [ATTN], [M]) need no rule: whatever they could leak they got from an
ORIG input, and autograd follows that path. One thing the rule cannot see is a context slot that
holds its own original (BERT's 10% "keep"): for an MLM that is by design, and UniLMv2's kept slots
are proven out of L_PAR by tests/test_pmlm.py.

The probe: the LM head's logits at row i projected on a random vector (so that no cancellation hides
a dependence), differentiated with respect to the input embeddings (token + position + segment), in
eval mode (dropout would make gradients random, not zero).
"""
from dataclasses import dataclass, field

import torch

from objectives.masks import CTX, ORIG, PAD


def forbidden_inputs(kind, step, row):
    """(L,) bool: the inputs the prediction at `row` of one example (kind, step: (L,)) may not
    depend on."""
    L = kind.size(0)
    j = torch.arange(L, device=kind.device)
    if kind[row] == CTX:
        bad = (kind != CTX) & (kind != PAD)
    else:
        bad = (kind == ORIG) & (step >= step[row]) & (j != row)
    return bad


def dependencies(model, batch, b, rows, attn_mask=None):
    """(len(rows), L): |d prediction(b, row) / d input embedding(b, j)| summed over the embedding
    dimension.

    attn_mask: a (B, L, L) mask to run the model with instead of the batch's own (e.g. a student's
    mask).
    """
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
    """One forbidden dependency: prediction at (example, row) depends on input `input` by
    `gradient`."""
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
    dependencies.

    examples: which examples to check (default all); max_rows: at most that many predictions per
    example; attn_mask: run the model with this mask instead of the batch's own (a hand-made or a
    student's mask).
    """
    report = Report()
    for b in (range(len(batch)) if examples is None else examples):
        rows = (batch.labels[b] != -100).nonzero().flatten().tolist()[:max_rows]
        grads = dependencies(model, batch, b, rows, attn_mask)
        if rows:
            bad = torch.stack([forbidden_inputs(batch.kind[b], batch.step[b], r) for r in rows])
        else:
            bad = torch.zeros_like(grads, dtype=torch.bool)
        report.rows[b] = rows
        report.grads[b] = grads
        report.forbidden[b] = bad
        for k, j in (bad & (grads > 0)).nonzero().tolist():
            report.leaks.append(Leak(b, rows[k], j, float(grads[k, j])))
    return report


def reachable(mask, n_layers):
    """Which inputs can influence each query through n_layers of attention: the boolean mask's
    matrix power.

    (B, L, L) -> (B, L, L). Every layer also carries a token's own state forward (the residual
    stream), so the mask gets its diagonal first. Compare with `dependencies`: autograd should find
    exactly these (or fewer).
    """
    m = mask | torch.eye(mask.size(-1), dtype=torch.bool, device=mask.device)
    r = m.clone()
    for _ in range(n_layers - 1):
        r = (r.float() @ m.float() > 0)
    return r

"""Grader of exercise 4 (UniLMv2's pseudo-masked mask): your mask against objectives/masks.py's on the paper's
example and on real pmlm batches, and the project's leakage checker run with your mask.

    python -m pytest exercises/test_04_pseudo_mask.py
"""
import random

import torch

from exercises import _grading as grading
from objectives import get_objective, leakage, masks
from objectives.masks import CTX, ORIG, PAD, PSEUDO
from objectives.pmlm import pseudo_masked_layout
from tokenizer import SPECIAL_TOKENS, WordPiece

ex = grading.load("ex04_pseudo_mask")

TOK = WordPiece(list(SPECIAL_TOKENS) + ["."] + [f"w{i}" for i in range(56)])      # 64 pieces


def why(kind, step):
    """The reason, in the paper's words, why cell (i, j) is what the project says."""
    def reason(i, j, got):
        qk, qb, kk, kb = int(kind[i]), int(step[i]), int(kind[j]), int(step[j])
        if PAD in (qk, kk):
            return "padding is never attended, and a padding row attends nothing"
        if got:
            if qk == CTX:
                return ("the context sees only the context: a context token that saw an appended token would "
                        "pass it on to every [P] reading the context (implicit leakage, UniLMv2 3.2)")
            if qk == ORIG and kk == ORIG:
                return f"an original of step {qb} sees the originals of steps <= {qb} only: step {kb} comes later"
            if qk == ORIG:
                return "originals never look at [P]s (Figure 5): they are the text so far, for later steps"
            if kk == ORIG and kb == qb:
                return "that is EXPLICIT leakage: the [P] would see the very token it predicts (Figure 5)"
            if kk == ORIG:
                return (f"step {kb} comes after step {qb} in the factorization order: a [P] sees the originals of "
                        "EARLIER steps only")
            return "a [P] sees only the [P]s of its own block (Figure 5)"
        if kk == CTX:
            return "every token sees the context (the text with [M] slots)"
        if qk == ORIG:
            return f"an original of step {qb} sees the originals of steps <= {qb}: the text so far, its own block too"
        if kk == ORIG:
            return f"a [P] of step {qb} sees the originals of the earlier steps: they come first in the order"
        return "the [P]s of one block are predicted together and see each other (Figure 5)"
    return reason


def check(batch):
    got = ex.pseudo_masked_mask(batch.kind, batch.step)
    want = masks.pseudo_masked(batch.kind, batch.step)
    assert torch.is_tensor(got) and got.dtype == torch.bool, "return a torch.bool tensor"
    assert got.shape == want.shape, f"the mask must have shape {tuple(want.shape)} (B, L, L), got {tuple(got.shape)}"
    for b in range(len(batch)):
        if not torch.equal(got[b], want[b]):
            say = grading.describe(batch.kind[b], batch.step[b])
            raise AssertionError(f"example {b}: " + grading.mask_diff_message(
                got[b], want[b], say, why(batch.kind[b], batch.step[b])))
    return got


def paper_batch():
    """The paper's example (Figures 4-5): x1..x6, blocks {x4, x5} then {x2}, every masked slot [M]."""
    x = [11, 12, 13, 14, 15, 16]
    context = [11, TOK.mask_id, 13, TOK.mask_id, TOK.mask_id, 16]
    row = pseudo_masked_layout(x, [0] * 6, context, [1, 3, 4], [[3, 4], [1]], TOK.pseudo_id)
    return get_objective("pmlm", TOK).collate([row])


def random_passages(rng, n):
    return [[[rng.randrange(7, 64) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 4))]
            for _ in range(n)]


def test_figure_5():
    got = check(paper_batch())
    assert got[0].int().tolist()[8] == [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0]


def test_real_pretraining_batches():
    obj = get_objective("pmlm", TOK)
    rng = random.Random(0)
    for seed in range(30):
        check(obj.make_batch(random_passages(rng, 4), random.Random(seed)))


def test_fine_tuning_batches():
    """Seq2seq fine-tuning (3.4): every target token is its own step, its [P] the query that predicts it."""
    obj = get_objective("pmlm", TOK, task="seq2seq")
    rng = random.Random(1)
    for seed in range(10):
        pairs = [([rng.randrange(7, 64) for _ in range(rng.randint(0, 9))],
                  [rng.randrange(7, 64) for _ in range(rng.randint(0, 6))]) for _ in range(3)]
        check(obj.make_batch(pairs, random.Random(seed)))


def test_padding():
    kind = torch.tensor([[CTX, CTX, ORIG, PSEUDO, PAD, PAD]])
    step = torch.tensor([[0, 0, 1, 1, 0, 0]])
    got = ex.pseudo_masked_mask(kind, step)
    assert not got[0, 4:].any() and not got[0, :, 4:].any(), \
        "padding rows must attend nothing and padding keys be attended by nobody"


def test_leak_free_through_the_layers():
    """The leakage checker runs a 3-layer model with YOUR mask on real batches: no [P] may depend on its own
    original or a later one, no [M] slot on any appended token (objectives/leakage.py)."""
    model = grading.tiny_model(len(TOK), n_layer=3)
    obj = get_objective("pmlm", TOK)
    rng = random.Random(2)
    for batch in [paper_batch()] + [obj.make_batch(random_passages(rng, 3), random.Random(s)) for s in range(3)]:
        mine = ex.pseudo_masked_mask(batch.kind, batch.step)
        report = leakage.check(model, batch, attn_mask=mine)
        if report.leaks:
            b = report.leaks[0].example
            raise AssertionError(grading.leak_message(report, grading.describe(batch.kind[b], batch.step[b]),
                                                      model))


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    check(paper_batch())

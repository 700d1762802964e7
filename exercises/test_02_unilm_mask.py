"""Grader of exercise 2 (UniLM's seq2seq mask): your masks against objectives/masks.py's, and the leakage
checker run with your mask.

    python -m pytest exercises/test_02_unilm_mask.py
"""
import random

import pytest
import torch

from exercises import _grading as grading
from objectives import leakage, masks

ex = grading.load("ex02_unilm_mask")


def part(k, n_src, n):
    return "padding" if k >= n else "source" if k < n_src else "target"


def why_seq2seq(n_src, n, mine=None):
    def why(i, j, got):
        qi, kj = part(i, n_src, n), part(j, n_src, n)
        if "padding" in (qi, kj):
            return "padding is never attended, and a padding row attends nothing (it carries no loss)"
        if got and qi == "source":
            # a source row that sees the first target token only: the source's end is off by one
            first = (f"key {j} is the first target token (the source is tokens 0..{n_src - 1}, j < n_src); "
                     if j == n_src and mine is not None and not mine[i, n_src + 1:n].any() else "")
            return first + ("a source token sees only the source; if it saw the target, every target token reading "
                            "the source would learn the target through it (leakage through the source)")
        if got:
            return ("a target token sees the target to its LEFT and itself, never a later one: that is what lets "
                    "the model generate left to right (UniLM 2.3)")
        if qi == "source":
            return "the source is read bidirectionally: every source token sees every source token"
        if i == j:
            return "a target token sees itself (j <= i, the diagonal) besides the source and the target to its left"
        return ("every target token sees the whole source, the target tokens to its left, and itself "
                "(UniLM 2.3, Figure 1)")
    return why


def compare(got, want, L, title, why=None, say=None):
    assert torch.is_tensor(got) and got.dtype == torch.bool, \
        f"{title} must be a torch.bool tensor, got {type(got).__name__} {getattr(got, 'dtype', '')}"
    assert tuple(got.shape) == (L, L), f"{title} must have shape ({L}, {L}), got {tuple(got.shape)}"
    assert torch.equal(got, want) or not torch.equal(got.T, want), \
        f"{title} is the transpose of the project's mask: row i is the QUERY (the token that attends), column j the " \
        f"KEY (the token attended to); mask[i, j] answers 'may token i read token j?'\nyours:\n{grading.picture(got)}" \
        f"\nthe project's:\n{grading.picture(want)}"
    if not torch.equal(got, want):
        say = say or (lambda k: f"token {k}")
        raise AssertionError(grading.mask_diff_message(got, want, say, why, title) +
                             f"\nyours:\n{grading.picture(got)}\nthe project's:\n{grading.picture(want)}")


def check_seq2seq(n_src, n, L):
    got = ex.seq2seq_mask(n_src, n, L)
    want = masks.seq2seq([n_src], [n], L)[0]
    compare(got, want, L, f"seq2seq_mask(n_src={n_src}, n={n}, L={L})", why_seq2seq(n_src, n, got),
            lambda k: part(k, n_src, n) + f" token {k}")


def test_the_picture():
    check_seq2seq(2, 5, 6)


@pytest.mark.parametrize("n_src, n, L", [(3, 3, 3), (3, 3, 5), (1, 4, 4), (4, 9, 12), (0, 3, 3)])
def test_edge_cases(n_src, n, L):
    """No target (the mask is bidirectional), padding, a one-token source, no source at all."""
    check_seq2seq(n_src, n, L)


def test_random_lengths():
    rng = random.Random(0)
    for _ in range(200):
        L = rng.randint(1, 24)
        n = rng.randint(1, L)
        check_seq2seq(rng.randint(0, n), n, L)


def test_leak_free_through_the_layers():
    """The leakage checker runs a 3-layer model with YOUR mask: no prediction may depend on what it predicts."""
    model = grading.tiny_model(40, n_layer=3)
    rng = random.Random(1)
    rows = []
    for n_src, n in ((4, 9), (3, 7), (5, 5)):
        kind, step = masks.unilm_kinds("seq2seq", n, n_src)
        ids = [rng.randrange(7, 40) for _ in range(n)]
        rows.append(dict(input_ids=ids, position_ids=list(range(n)), segment_ids=[0] * n_src + [1] * (n - n_src),
                         labels=ids, kind=kind, step=step))        # every token is probed as a prediction
    batch = grading.batch_of(rows)
    L = batch.input_ids.size(1)
    mine = torch.stack([ex.seq2seq_mask(n_src, n, L) for n_src, n in ((4, 9), (3, 7), (5, 5))])
    report = leakage.check(model, batch, attn_mask=mine)
    say = grading.describe(batch.kind[report.leaks[0].example], batch.step[report.leaks[0].example], {
        masks.CTX: "source", masks.ORIG: "target token {b}"}) if report.leaks else None
    assert not report.leaks, grading.leak_message(report, say, model)


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    check_seq2seq(2, 5, 6)

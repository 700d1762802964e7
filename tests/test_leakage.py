"""The one mask rule (objectives/masks.py) against every paper's builder, and the public leakage checker
(objectives/leakage.py): every objective's batches are proven leak-free in both block layouts (pre-LN, BERT's
post-LN), and a wrong mask is caught."""
import random

import pytest
import torch

from objectives import get_objective, leakage, masks
from objectives.masks import CTX, ORIG, PAD, PSEUDO, SPAN
from tests.helpers import tiny_model

TASKS = [("unilm", "pretrain"), ("unilm", "seq2seq"), ("pmlm", "pretrain"), ("pmlm", "seq2seq"),
         ("ernie_gen", "pretrain"), ("ernie_gen", "seq2seq"), ("palm", "pretrain"), ("palm", "seq2seq")]


@pytest.mark.parametrize("lm", ["bidirectional", "left_to_right", "right_to_left", "seq2seq"])
def test_the_rule_makes_unilms_four_masks(lm):
    for n, n_src, L in [(1, 1, 1), (5, 2, 5), (7, 3, 9), (12, 12, 12), (9, 1, 11)]:
        kind, step = masks.unilm_kinds(lm, n, n_src)
        kind = torch.tensor(kind + [PAD] * (L - n))[None]
        step = torch.tensor(step + [0] * (L - n))[None]
        built = {"bidirectional": lambda: masks.bidirectional([n], L),
                 "left_to_right": lambda: masks.left_to_right([n], L),
                 "right_to_left": lambda: masks.right_to_left([n], L),
                 "seq2seq": lambda: masks.seq2seq([n_src], [n], L)}[lm]()
        assert torch.equal(masks.attention_mask(kind, step), built), (lm, n, n_src, L)


def test_the_rule_cell_by_cell_for_every_kind():
    # one sequence with one token of each kind: CTX, ORIG of steps 1 and 2, PSEUDO of steps 1, 1 and 2,
    # SPAN of steps 2 and 2, PAD
    kind = torch.tensor([[CTX, ORIG, ORIG, PSEUDO, PSEUDO, PSEUDO, SPAN, SPAN, PAD]])
    step = torch.tensor([[0, 1, 2, 1, 1, 2, 2, 2, 0]])
    want = ["100000000",     # CTX: the context only
            "110000000",     # ORIG 1: context + ORIG <= 1
            "111000000",     # ORIG 2: context + ORIG <= 2
            "100110000",     # PSEUDO 1: context + the PSEUDO of step 1
            "100110000",
            "110001000",     # PSEUDO 2: context + ORIG < 2 + its step's PSEUDO (itself)
            "110000100",     # SPAN 2: context + ORIG < 2 + itself (not its span-mate)
            "110000010",
            "000000000"]     # PAD sees nothing
    got = ["".join(str(int(v)) for v in row) for row in masks.attention_mask(kind, step)[0].tolist()]
    assert got == want
    # elementwise on scalars: one cell, as FlexAttention's mask_mod calls it
    assert bool(masks.may_attend(torch.tensor(PSEUDO), torch.tensor(2), torch.tensor(ORIG), torch.tensor(1),
                                 torch.tensor(False)))


def make_batch(name, task, tok, passages, pairs, seed=0):
    obj = get_objective(name, tok, task=task, max_len=128)
    obj.set_step(10, 10)                                   # PALM: stage 2, the continuation
    rng = random.Random(seed)
    examples = rng.sample(passages["valid"], 3) if task == "pretrain" else pairs["valid"][3 * seed:3 * seed + 3]
    return obj, obj.make_batch(examples, rng)


@pytest.mark.parametrize("post_ln", [False, True], ids=["pre-LN", "post-LN"])
@pytest.mark.parametrize("name,task", TASKS)
def test_every_objective_is_proven_leak_free(tok, passages, pairs, name, task, post_ln):
    obj, batch = make_batch(name, task, tok, passages, pairs)
    model = tiny_model(len(tok), n_layer=3, rel_pos_buckets=32 if name == "pmlm" else 0, post_ln=post_ln)
    report = leakage.check(model, batch, max_rows=40)
    assert report.leaks == [], str(report)
    n_pred = sum(len(r) for r in report.rows.values())
    n_forbidden = sum(int(f.sum()) for f in report.forbidden.values())
    assert n_pred >= 6
    # the check has teeth: outside the examples that hide nothing, there are forbidden inputs to stay away from
    if (name, task) != ("unilm", "pretrain") or batch.extras["lm_type"] != 0:
        assert n_forbidden > 0
    # and every prediction depends on something (a dead probe would prove nothing)
    assert all((g.sum(-1) > 0).all() for g in report.grads.values())
    assert "leak-free" in str(report)


@pytest.mark.parametrize("post_ln", [False, True], ids=["pre-LN", "post-LN"])
@pytest.mark.parametrize("name,task", [("pmlm", "pretrain"), ("ernie_gen", "seq2seq"), ("unilm", "seq2seq"),
                                       ("palm", "seq2seq")])
def test_a_wrong_mask_is_caught(tok, passages, pairs, name, task, post_ln):
    """Run the same batch with an all-visible (bidirectional) mask: every objective then leaks, and the report
    names the prediction and the input."""
    obj, batch = make_batch(name, task, tok, passages, pairs)
    model = tiny_model(len(tok), rel_pos_buckets=32 if name == "pmlm" else 0, post_ln=post_ln)
    real = batch.kind != PAD
    everything = real[:, :, None] & real[:, None, :]
    report = leakage.check(model, batch, examples=[0], attn_mask=everything)
    assert report.leaks, name
    leak = report.leaks[0]
    assert report.forbidden[0][report.rows[0].index(leak.row), leak.input]
    assert leak.gradient > 0 and "forbidden dependencies" in str(report)


def test_reachability_bounds_autograd(tok, passages, pairs):
    """What autograd finds is inside what the mask can reach through n_layers (plus the residual stream)."""
    obj, batch = make_batch("pmlm", "pretrain", tok, passages, pairs)
    model = tiny_model(len(tok), n_layer=2, rel_pos_buckets=32)
    reach = leakage.reachable(batch.attn_mask, 2)
    report = leakage.check(model, batch, examples=[0], max_rows=20)
    depends = report.depends(0)
    assert not (depends & ~reach[0, report.rows[0]]).any()

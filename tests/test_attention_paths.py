"""One truth per mask, three attention paths: the dense mask, FlexAttention's mask_mod and block mask, and the
relative bias as a score_mod (the GPU speed layer, fast/) all compute what the naive path computes, in both block
layouts (forward here on the CPU; values AND gradients on a GPU in bench/check_cuda.py, since FlexAttention has no
backward on a CPU)."""
import random

import pytest
import torch

import fast
from objectives import get_objective
from objectives.masks import PAD
from tests.helpers import tiny_model

TASKS = [("unilm", "pretrain"), ("unilm", "seq2seq"), ("pmlm", "pretrain"), ("pmlm", "seq2seq"),
         ("ernie_gen", "pretrain"), ("ernie_gen", "seq2seq"), ("palm", "pretrain"), ("palm", "seq2seq")]


def batch_of(name, task, tok, passages, pairs):
    obj = get_objective(name, tok, task=task, max_len=128)
    obj.set_step(10, 10)
    rng = random.Random(0)
    examples = rng.sample(passages["valid"], 4) if task == "pretrain" else pairs["valid"][:4]
    return obj.make_batch(examples, rng)


@pytest.mark.parametrize("name,task", TASKS)
def test_mask_mod_is_the_dense_rule_cell_by_cell(tok, passages, pairs, name, task):
    batch = batch_of(name, task, tok, passages, pairs)
    B, L = batch.input_ids.shape
    spec = batch.mask
    dense = spec.dense()
    assert torch.equal(dense, batch.attn_mask)
    b, q, k = (t.flatten() for t in torch.meshgrid(torch.arange(B), torch.arange(L), torch.arange(L),
                                                   indexing="ij"))
    cells = fast.mask_mod(spec)(b, torch.zeros_like(b), q, k).view(B, L, L)
    pad_rows = (batch.kind == PAD)[:, :, None] & torch.eye(L, dtype=torch.bool)[None]
    assert torch.equal(cells, dense | pad_rows)


@pytest.mark.parametrize("post_ln", [False, True], ids=["pre-LN", "post-LN"])
@pytest.mark.parametrize("name,task", TASKS)
def test_flex_and_sdpa_equal_naive_forward(tok, passages, pairs, name, task, post_ln):
    batch = batch_of(name, task, tok, passages, pairs)
    rel = 32 if name == "pmlm" else 0
    outs = {}
    for impl in ("naive", "sdpa", "flex"):
        model = tiny_model(len(tok), rel_pos_buckets=rel, attn_impl=impl, copy_head=name == "palm",
                           post_ln=post_ln)
        with torch.no_grad():
            h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        outs[impl] = h[batch.kind != PAD]                  # padding rows may differ; they carry no loss
    torch.testing.assert_close(outs["sdpa"], outs["naive"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["flex"], outs["naive"], rtol=1e-5, atol=1e-5)


def test_flex_refuses_to_train_on_a_cpu(tok, passages, pairs):
    batch = batch_of("pmlm", "pretrain", tok, passages, pairs)
    model = tiny_model(len(tok), rel_pos_buckets=32, attn_impl="flex")
    with pytest.raises(RuntimeError, match="CUDA only"):
        model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)

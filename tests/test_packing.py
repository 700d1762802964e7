"""Packing (fast.plan_packing, fast.Packed): several passages in one row for the blocks, exact for every objective.

Three properties hold it equal to one passage a row:
  - the layout: packing then unpacking gives every token back, rows are full, no two passages overlap;
  - the numbers: the same passages packed and one a row give the same per-token losses and the same objective
    loss (float64, naive and sdpa attention; FlexAttention forward too), because positions, and so the relative
    bias's buckets, restart with every passage and the mask adds "and only its own passage";
  - no leakage between passages, by autograd on the packed rows (objectives/leakage.py's probe): the gradient of
    every prediction of passage A with respect to every input of passage B is exactly zero, and inside a passage
    the objective's own rule (leakage.forbidden_inputs) still holds. A mask without the passage rule is caught.
"""
import random
import warnings

import pytest
import torch
import torch.nn.functional as F

import data
import fast
import train
from objectives import get_objective, leakage
from objectives.masks import PAD, MaskSpec
from tests.helpers import tiny_model
from tests.test_train import corpus, losses, run  # noqa: F401 (corpus: test_train's fixture)

TASKS = [("unilm", "pretrain"), ("unilm", "seq2seq"), ("pmlm", "pretrain"), ("pmlm", "seq2seq"),
         ("ernie_gen", "pretrain"), ("ernie_gen", "seq2seq"), ("palm", "pretrain"), ("palm", "seq2seq"),
         ("mass", "pretrain")]


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # ERNIE-GEN without a span vocabulary says so
        yield


def objective_and_batch(name, task, tok, passages, pairs, n=8, seed=0, multiple=1):
    obj = get_objective(name, tok, task=task, max_len=128)
    obj.set_step(10, 10)                           # PALM: stage 2, the continuation
    rng = random.Random(seed)
    if task == "pretrain":
        # whole passages and first sentences: lengths that share rows
        examples = [p if k % 2 else p[:1] for k, p in enumerate(rng.sample(passages["valid"], n))]
    else:
        examples = [(src if k % 2 else src[:6], tgt) for k, (src, tgt) in enumerate(pairs["valid"][:n])]
    return obj, fast.plan_packing(obj.make_batch(examples, rng), multiple)


def model_for(name, tok, impl="naive", n_layer=2):
    rel = 32 if name == "pmlm" else 0              # UniLMv2's relative bias: its buckets must restart too
    return tiny_model(len(tok), n_layer=n_layer, rel_pos_buckets=rel, attn_impl=impl,
                      copy_head=name == "palm", n_segment=6).double()


def packed_inputs(batch):
    """The packed rows the blocks see: ids, positions, segments and the mask with its passage vector."""
    packing = fast.Packing.of(batch)
    B, L = batch.input_ids.shape
    passage = torch.arange(B)[:, None].expand(B, L)
    p = packing.pack
    spec = MaskSpec(p(batch.kind, PAD), p(batch.step, 0), p(passage, -1))
    return p(batch.input_ids, 0), p(batch.position_ids, 0), p(batch.segment_ids, 0), p(batch.labels, -100), spec


def token_losses(model, batch):
    """Cross-entropy of the LM head at every labelled row, in the batch's own order."""
    h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
    rows = batch.labels != -100
    return F.cross_entropy(model.lm_logits(h[rows]), batch.labels[rows], reduction="none")


# --- the layout ---------------------------------------------------------------------------------------------------


def test_pack_rows_best_fit_decreasing():
    lengths = [5, 9, 3, 7, 1, 4, 10]
    place, rows = fast.pack_rows(lengths, 10)
    assert rows == 4                               # 39 tokens need 4 rows of 10; BFD finds it
    used = {}
    for n, (r, offset) in zip(lengths, place):
        assert 0 <= offset and offset + n <= 10
        used.setdefault(r, []).append((offset, offset + n))
    for spans in used.values():                    # no two passages of a row overlap
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_pack_width_saves_the_last_row():
    """Short passages: rows as wide as the longest leave the last row half empty; a little wider saves it. With a
    price on width (dense attention) the cheapest width is never wider than needed."""
    lengths = [100] + [30] * 10                    # 400 tokens: 5 rows of 100 (three 30s a row), 4 rows of 120
    assert fast.pack_rows(lengths, 100)[1] == 5
    width = fast.pack_width(lengths)
    rows = fast.pack_rows(lengths, width)[1]
    assert rows * width <= 4 * 120 and width >= 100
    assert fast.pack_width(lengths, multiple=64) % 64 == 0
    assert fast.pack_width([100, 100, 100], key_cost=0.01) == 100   # nothing to gain, width costs
    # the price of width: what dense attention computes per key; FlexAttention skips the tiles between passages
    assert fast.key_cost(tiny_model(100, attn_impl="sdpa")) > 0
    assert fast.key_cost(tiny_model(100, attn_impl="flex")) == 0


def test_pack_width_within_a_padding_budget():
    """max_padding: the cheapest width whose rows are at most that share padding, else the width with the fewest
    slots (bench/padding.py's "cheapest within 5%" layout)."""
    # width 96: rows 96 | 64+32 | 64, 288 slots for 256 tokens (11% padding), the cheapest at 0.01 a key;
    # width 128: 96+32 | 64+64, no padding
    lengths = [96, 32, 64, 64]
    assert fast.pack_width(lengths, 32, key_cost=0.01) == 96
    assert fast.pack_width(lengths, 32, key_cost=0.01, max_padding=0.05) == 128
    assert fast.pack_width(lengths, 32, key_cost=0.01, max_padding=0.2) == 96
    # no width pads under 5% (96: 29%, 128: 47%, 160: 15%, 192: 29%): the fewest slots, 160
    assert fast.pack_width([96, 40], 32, key_cost=0.01, max_padding=0.05) == 160


@pytest.mark.parametrize("name,task", TASKS)
@pytest.mark.parametrize("multiple", [1, 64])
def test_pack_then_unpack_gives_every_token_back(tok, passages, pairs, name, task, multiple):
    _, batch = objective_and_batch(name, task, tok, passages, pairs, multiple=multiple)
    rows, width = batch.extras["pack_shape"]
    real = batch.kind != PAD
    assert width % multiple == 0 and width >= real.sum(1).max()
    assert rows < len(batch)                       # several passages share a row: the test has teeth
    ids, pos, seg, labels, spec = packed_inputs(batch)
    assert ids.shape == (rows, width)
    # every real token exactly once, in its passage's order; the rest of the packed rows is padding
    assert int((spec.kind != PAD).sum()) == int(real.sum())
    unpack = lambda t: fast.Packing.of(batch).unpack(t[..., None], real.shape)[..., 0]
    assert torch.equal(unpack(pos)[real], batch.position_ids[real]) and (unpack(ids)[~real] == 0).all()
    for b in range(len(batch)):
        mine = spec.passage == b
        assert torch.equal(ids[mine], batch.input_ids[b][real[b]])
        assert torch.equal(labels[mine], batch.labels[b][real[b]])
        # a passage is contiguous in one row, its positions restarting as the objective made them
        r, cols = mine.nonzero(as_tuple=True)
        assert len(set(r.tolist())) == 1 and torch.equal(cols, torch.arange(cols[0], cols[0] + len(cols)))
    assert torch.equal(unpack(ids)[real], batch.input_ids[real])


def test_an_empty_batch_is_left_as_it_is(tok):
    obj = get_objective("unilm", tok, max_len=128)
    batch = fast.plan_packing(obj.make_batch([[[]], [[]]], random.Random(0)))
    assert len(batch) == 0 and "pack_shape" not in batch.extras
    assert fast.packed("model", batch) == "model"


# --- the numbers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,task", TASKS)
@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_packed_losses_equal_one_passage_a_row(tok, passages, pairs, name, task, impl):
    obj, batch = objective_and_batch(name, task, tok, passages, pairs)
    model = model_for(name, tok, impl)
    view = fast.packed(model, batch)
    assert isinstance(view, fast.Packed)
    with torch.no_grad():
        alone = token_losses(model, batch)
        together = token_losses(view, batch)
        loss_alone, metrics_alone = obj.loss(model, batch)
        loss_together, metrics_together = obj.loss(view, batch)
    assert alone.numel() >= 8
    torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_together, loss_alone, rtol=1e-12, atol=1e-12)
    for key, value in metrics_alone.items():
        torch.testing.assert_close(torch.as_tensor(metrics_together[key]), torch.as_tensor(value),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,task", [("pmlm", "pretrain"), ("palm", "pretrain"), ("unilm", "pretrain")])
def test_packed_gradients_equal_one_passage_a_row(tok, passages, pairs, name, task):
    """Training sees the same thing: every parameter's gradient of the objective's loss, packed or not."""
    obj, batch = objective_and_batch(name, task, tok, passages, pairs)
    model = model_for(name, tok, "sdpa")
    grads = []
    for m in (model, fast.packed(model, batch)):
        model.zero_grad()
        obj.loss(m, batch)[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,task", [("pmlm", "pretrain"), ("ernie_gen", "pretrain"), ("palm", "pretrain")])
def test_flex_follows_the_passage_rule(tok, passages, pairs, name, task):
    """FlexAttention's mask_mod reads the passage vector too: cell by cell the dense packed mask, and the packed
    forward on the flex path equals the naive one (forward only: no FlexAttention backward on a CPU)."""
    _, batch = objective_and_batch(name, task, tok, passages, pairs)
    _, _, _, _, spec = packed_inputs(batch)
    R, W = spec.kind.shape
    b, q, k = (t.flatten() for t in torch.meshgrid(torch.arange(R), torch.arange(W), torch.arange(W), indexing="ij"))
    cells = fast.mask_mod(spec)(b, torch.zeros_like(b), q, k).view(R, W, W)
    pad_rows = (spec.kind == PAD)[:, :, None] & torch.eye(W, dtype=torch.bool)[None]
    assert torch.equal(cells, spec.dense() | pad_rows)
    outs = {}
    for impl in ("naive", "flex"):
        model = model_for(name, tok, impl).float()
        with torch.no_grad():
            outs[impl] = token_losses(fast.packed(model, batch), batch)
    torch.testing.assert_close(outs["flex"], outs["naive"], rtol=1e-5, atol=1e-5)


def test_train_loss_module_packs(tok, passages, pairs):
    """train.py's door (use_fast_layer with --pack true): data.StepBatches plans the packing, LossModule hands the
    objective the packed view, and the loss is the one of the same batch unpacked."""
    obj = get_objective("pmlm", tok, max_len=128)
    model = model_for("pmlm", tok, "sdpa")
    pack, view, graph = train.use_fast_layer(model, obj, train.TrainConfig(pack="true", compile="false"),
                                             torch.device("cpu"), "fp32")
    assert not graph
    assert view is fast.packed
    module = train.LossModule(model, obj, view)
    unpacked = data.StepBatches(obj, passages["train"], 8, 1, 0, 10).build(3)[0]
    packed = data.StepBatches(obj, passages["train"], 8, 1, 0, 10, pack=pack).build(3)[0]
    assert "pack_shape" not in unpacked.extras and packed.extras["pack_shape"][0] < len(packed)
    with torch.no_grad():
        torch.testing.assert_close(module(packed)[0], module(unpacked)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("objective", ["pmlm", "palm"])
def test_train_py_pack_true_trains_as_pack_false(tmp_path, corpus, objective, monkeypatch):
    """train.py --pack true on a CPU (auto packs on CUDA only): the same losses step after step as --pack false
    (no dropout: its masks would fall on other slots)."""
    args = ["--objective", objective, "--max_steps", "4", "--dropout", "0"]
    one = losses(run(args + ["--pack", "false"], tmp_path, corpus, "one"))
    plans = []
    plan = fast.plan_packing
    monkeypatch.setattr(fast, "plan_packing", lambda *a, **kw: plans.append(plan(*a, **kw)) or plans[-1])
    packed = losses(run(args + ["--pack", "true"], tmp_path, corpus, "packed"))
    assert len(one) == 4
    assert packed == pytest.approx(one, rel=1e-4)
    # the training batches were packed, some into fewer rows than passages
    assert len(plans) == 4 and any(b.extras["pack_shape"][0] < len(b) for b in plans)


def test_steady_packing_keeps_one_width(tok, passages):
    """train.py --pack with compiled blocks (fast.SteadyPacking): every batch in rows of one width, the widest
    passage yet rounded up to 64 (only the count of rows changes, so the blocks compile for few shapes); each
    batch is packed as plan_packing packs it at that width, and the width grows only for a longer passage."""
    obj = get_objective("pmlm", tok, max_len=128)
    steady = fast.SteadyPacking(multiple=64)
    rng = random.Random(0)
    # whole passages and their first sentences (the corpus's passages are nearly all full)
    mixed = [[p if rng.random() < 0.5 else p[:1] for p in rng.sample(passages["train"], 8)] for _ in range(30)]
    batches = [steady(obj.make_batch(examples, random.Random(k))) for k, examples in enumerate(mixed)]
    widths = [b.extras["pack_shape"][1] for b in batches]
    assert all(w % 64 == 0 for w in widths) and widths == sorted(widths)
    assert len(set(widths)) <= 2 and len({b.extras["pack_shape"] for b in batches}) < len(batches)
    for b in batches:
        L = (b.kind != PAD).sum(1).max().item()
        assert widths[-1] >= L
    # the same rows as plan_packing at that width, and never wider than the longest passage needs
    again = fast.plan_packing(batches[-1], 64, width=widths[-1])
    assert again.extras["pack_shape"] == batches[-1].extras["pack_shape"]
    assert fast.plan_packing(batches[0], 64, width=0).extras["pack_shape"][1] <= widths[0]
    # a passage longer than the width widens the rows
    assert fast.plan_packing(batches[0], 8, width=8).extras["pack_shape"][1] >= L


def test_padding_report_counts_steady_rows_from_a_wider_start(tok, passages):
    """bench/padding.py --steady_widths: SteadyPacking's rows from a given start width, their share of
    padding and their dense-attention FLOPs (rows * width * (1 + key_cost * width)) against steady x64's."""
    from bench import padding as report
    obj = get_objective("unilm", tok, max_len=128)
    rng = random.Random(0)
    batches = [obj.make_batch(rng.sample(passages["train"], 8), random.Random(k)) for k in range(4)]
    real = sum(int((b.kind != PAD).sum()) for b in batches)
    # from 0 it is train.py's steady x64; from 256 every batch is in rows of 256
    assert report.padding(batches, 64, True, steady=True, start=0) == report.padding(batches, 64, True, steady=True)
    share, rows = report.padding(batches, 64, True, steady=True, start=256)
    assert share == pytest.approx(1 - real / (rows * len(batches) * 256))
    shapes = [fast.plan_packing(b, 64, width=256).extras["pack_shape"] for b in batches]
    assert all(w == 256 for _, w in shapes) and rows == sum(n for n, _ in shapes) / len(batches)
    assert report.cost(batches, 256, 1e-3) == pytest.approx(sum(n * 256 * 1.256 for n, _ in shapes))
    assert report.cost(batches, 256, 0.0) == rows * len(batches) * 256


# --- no leakage between passages --------------------------------------------------------------------------------------


def packed_dependencies(model, batch, spec_of=lambda spec: spec):
    """For every packed row: (|d prediction / d input embedding| (n_pred, W), rows of the predictions), by
    leakage.dependencies on a Batch of the packed rows, run with the packed mask (or spec_of's)."""
    ids, pos, seg, labels, spec = packed_inputs(batch)
    rows_batch = type(batch)(ids, pos, seg, labels, spec.kind, spec.step)
    mask = spec_of(spec).dense()
    out = []
    for r in range(ids.size(0)):
        rows = (labels[r] != -100).nonzero().flatten().tolist()
        out.append((leakage.dependencies(model, rows_batch, r, rows, attn_mask=mask), rows, spec, r))
    return out


@pytest.mark.parametrize("name,task", TASKS)
def test_packed_passages_never_see_each_other(tok, passages, pairs, name, task):
    _, batch = objective_and_batch(name, task, tok, passages, pairs, n=6)
    model = model_for(name, tok, "naive", n_layer=3)
    n_pred = n_other = 0
    for grads, rows, spec, r in packed_dependencies(model, batch):
        for k, row in enumerate(rows):
            mine = spec.passage[r] == spec.passage[r, row]
            other = (spec.passage[r] != spec.passage[r, row]) & (spec.kind[r] != PAD)
            # passage B's inputs: exactly zero, not small
            assert (grads[k][other] == 0).all(), f"row {r}: prediction {row} depends on another passage"
            # inside its passage the objective's own rule still holds
            forbidden = leakage.forbidden_inputs(spec.kind[r], spec.step[r], row) & mine
            assert (grads[k][forbidden] == 0).all()
            assert grads[k][mine].sum() > 0         # a live probe
            n_pred += 1
            n_other += int(other.sum())
    assert n_pred >= 6 and n_other > 0             # predictions that share a row with other passages


@pytest.mark.parametrize("name,task", [("unilm", "pretrain"), ("pmlm", "pretrain"), ("palm", "seq2seq")])
def test_a_mask_without_the_passage_rule_leaks(tok, passages, pairs, name, task):
    """The same packed rows with the passage vector dropped: predictions then depend on other passages, so the
    test above has teeth."""
    _, batch = objective_and_batch(name, task, tok, passages, pairs, n=6)
    model = model_for(name, tok, "naive", n_layer=3)
    no_passage = lambda spec: MaskSpec(spec.kind, spec.step)
    leaks = 0
    for grads, rows, spec, r in packed_dependencies(model, batch, no_passage):
        for k, row in enumerate(rows):
            other = (spec.passage[r] != spec.passage[r, row]) & (spec.kind[r] != PAD)
            leaks += int((grads[k][other] > 0).sum())
    assert leaks > 0

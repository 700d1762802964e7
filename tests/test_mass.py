"""MASS (objectives/mass.py, the capstone's reference solution): the layout written out, span statistics,
leakage by autograd in both tasks, fine-tuning == generate.py's decoding loop, and train.py -> generate.py."""
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import generate as G
import objectives
import train
from objectives import OBJECTIVES, get_objective, leakage, masks, objective_class
from objectives.masks import CTX, ORIG
from objectives.mass import MassObjective, span_layout
from tests.helpers import tiny_model, write_docs, write_title_task
from tests.test_train import TINY

ROOT = Path(__file__).resolve().parents[1]


def test_registered_as_mass(tok):
    assert OBJECTIVES["mass"] is MassObjective and objective_class("mass") is MassObjective
    for task in ("pretrain", "seq2seq"):
        obj = get_objective("mass", tok, task=task)
        assert isinstance(obj, MassObjective) and obj.task == task and obj.query_token is None
    assert get_objective("mass", tok, span_frac=0.3).span_frac == 0.3
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="span_frac"):
            get_objective("mass", tok, span_frac=bad)


# --- the layout ---------------------------------------------------------------------------------------------------

def test_figure_1_written_out(tok):
    """MASS Figure 1: x1..x8 with the span x3..x6 masked; the span part is x3..x6 shifted right, at their positions."""
    S, E, M = tok.sos_id, tok.eos_id, tok.mask_id
    x = [11, 12, 13, 14, 15, 16, 17, 18]
    ex = span_layout(x, 2, 4, S, E, M)
    assert ex.input_ids == [S, 11, 12, M, M, M, M, 17, 18, E] + [S, 13, 14, 15]
    assert ex.position_ids == list(range(10)) + [3, 4, 5, 6]          # the row at x_p's position predicts x_p
    assert ex.segment_ids == [0] * 10 + [1] * 4
    assert ex.labels == [-100] * 10 + [13, 14, 15, 16]
    assert ex.kind == [CTX] * 10 + [ORIG] * 4 and ex.step == [0] * 10 + [1, 2, 3, 4]
    mask = get_objective("mass", tok).collate([ex]).attn_mask[0]
    want = torch.zeros(14, 14, dtype=torch.bool)
    want[:, :10] = True                                                  # everyone sees the (holed) passage
    want[10:, 10:] = torch.ones(4, 4, dtype=torch.bool).tril()          # the span part: itself and the rows before
    assert torch.equal(mask, want)


def test_pretrain_example_draws_the_span_with_the_rng(tok):
    obj = get_objective("mass", tok)
    passage = [[11, 12, 13], [14, 15, 16, 17, 18]]
    rng = random.Random(5)
    u = random.Random(5).randint(0, 8 - 4)
    assert obj.pretrain_example(passage, rng) == span_layout(sum(passage, []), u, 4, tok.sos_id, tok.eos_id,
                                                             tok.mask_id)


def test_seq2seq_layout_written_out(tok):
    """[SOS] src [EOS] | [SOS] y: generate.py's layout without a query token (as PALM's, without the gap)."""
    S, E = tok.sos_id, tok.eos_id
    batch = get_objective("mass", tok, task="seq2seq").make_batch([([21, 22], [31, 32]), ([23], [])],
                                                                  random.Random(0))
    assert batch.input_ids.tolist() == [[S, 21, 22, E, S, 31, 32], [S, 23, E, S, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 0, 0, 0]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0]]
    assert batch.labels.tolist() == [[-100] * 4 + [31, 32, E], [-100] * 3 + [E, -100, -100, -100]]
    assert batch.kind.tolist() == [[CTX] * 4 + [ORIG] * 3, [CTX] * 3 + [ORIG] + [masks.PAD] * 3]
    assert batch.step.tolist() == [[0] * 4 + [1, 2, 3], [0, 0, 0, 1, 0, 0, 0]]
    assert torch.equal(batch.attn_mask[0], masks.seq2seq([4], [7], 7)[0])


def test_span_statistics(tok, passages):
    """k = round(span_frac x n) (at least 1), the start uniform over the n - k + 1 places, the rest context."""
    obj = get_objective("mass", tok)
    rng = random.Random(0)
    starts = []
    for passage in passages["valid"][:300]:
        flat = [t for s in passage for t in s]
        ex = obj.pretrain_example(passage, rng)
        span = [y for y in ex.labels if y != -100]
        n, k = len(flat), len(span)
        assert k == max(1, round(0.5 * n))
        u = ex.position_ids[ex.labels.index(span[0])] - 1
        assert flat[u:u + k] == span and ex.input_ids[1:n + 1] == flat[:u] + [tok.mask_id] * k + flat[u + k:]
        if n - k >= 4:
            starts.append(u / (n - k))
    assert 0.4 < statistics.mean(starts) < 0.6 and min(starts) == 0.0 and max(starts) == 1.0


def test_bad_inputs_are_skipped_or_truncated(tok, monkeypatch):
    monkeypatch.setattr(objectives, "_warned", set())                  # warn_once warns again in this test
    obj = get_objective("mass", tok, max_len=12)
    with pytest.warns(UserWarning, match="truncated"):
        batch = obj.make_batch([[[]], [[30] * 20, [31] * 5], [[32]]], random.Random(0))
    assert obj.skipped == {"empty passage": 1} and len(batch) == 2
    assert int(batch.position_ids.max()) == 11 and int((batch.labels[0] != -100).sum()) == 5   # 10 tokens, k 5
    assert batch.labels[1].tolist()[3:4] == [32]                      # one token: a span of one
    s2s = get_objective("mass", tok, task="seq2seq", max_len=16)
    with pytest.warns(UserWarning, match="truncated"):
        batch = s2s.make_batch([([30] * 40, [31] * 5), ([], [32] * 40)], random.Random(0))
    assert int(batch.position_ids.max()) < 16
    assert (batch.labels[0] != -100).sum() == 6 and (batch.labels[1] != -100).sum() == 14     # source first
    assert batch.input_ids[0, :10].tolist() == [tok.sos_id] + [30] * 8 + [tok.eos_id]


def test_corpus_tokens(tok):
    """Throughput counts the corpus read: [SOS] x [EOS] in pre-training (the span part copies masked slots)."""
    pre = get_objective("mass", tok).make_batch([[[11, 12, 13, 14]]], random.Random(0))
    s2s = get_objective("mass", tok, task="seq2seq").make_batch([([11, 12], [13])], random.Random(0))
    assert get_objective("mass", tok).corpus_tokens(pre) == 6
    assert get_objective("mass", tok, task="seq2seq").corpus_tokens(s2s) == 6


def test_determinism(tok, passages):
    obj = get_objective("mass", tok)
    a = obj.make_batch(passages["train"][:8], random.Random(3))
    b = obj.make_batch(passages["train"][:8], random.Random(3))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


# --- leakage ------------------------------------------------------------------------------------------------------

def test_no_leakage_by_autograd(tok, passages, pairs):
    """Through 3 layers: a span row depends on no later span row (its answer among them), the context on no
    span row; fine-tuning likewise. And the checker has teeth: an all-to-all mask leaks."""
    model = tiny_model(len(tok), n_layer=3)
    pre = get_objective("mass", tok).make_batch(passages["valid"][:3], random.Random(1))
    s2s = get_objective("mass", tok, task="seq2seq").make_batch(pairs["valid"][:3], random.Random(1))
    for batch in (pre, s2s):
        report = leakage.check(model, batch, max_rows=12)
        assert report.leaks == [], str(report)
        assert sum(map(len, report.rows.values())) > 10
        # a span row depends on the context and on the span rows before it, through the layers
        b = 0
        grads = report.gradients(b)[-1]                  # the last prediction of example 0
        assert (grads[batch.kind[b] == CTX] > 0).any() and (grads[(batch.kind[b] == ORIG)][:2] > 0).all()
    real = pre.kind != masks.PAD
    everything = real[:, :, None] & real[:, None, :]
    assert leakage.check(model, pre, examples=[0], max_rows=4, attn_mask=everything).leaks


# --- fine-tuning == decoding --------------------------------------------------------------------------------------

def test_fine_tuning_equals_decoding(tok, pairs):
    """Teacher-forced log-probs of the training batch == generate.score_targets (cache and no cache); the loss is
    their mean negative log-likelihood, so evaluate.perplexity is exp(loss)."""
    model = tiny_model(len(tok))
    obj = get_objective("mass", tok, task="seq2seq")
    examples = pairs["valid"][:5]
    srcs, tgts = [s for s, _ in examples], [t for _, t in examples]
    forced = G.score_targets(model, obj, srcs, [t + [tok.eos_id] for t in tgts])
    uncached = G.score_targets(model, obj, srcs, [t + [tok.eos_id] for t in tgts], use_cache=False)
    batch = obj.make_batch(examples, random.Random(0))
    with torch.no_grad():
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)
        loss, _ = obj.loss(model, batch)
    nll, n = 0.0, 0
    for b, (src, tgt) in enumerate(examples):
        rows = (batch.labels[b] != -100).nonzero().flatten()
        assert batch.position_ids[b, rows].tolist() == list(range(len(src) + 2, len(src) + 3 + len(tgt)))
        with torch.no_grad():
            logp = model.lm_logits(h[b, rows]).float().log_softmax(-1)
        logp = logp.gather(1, batch.labels[b, rows][:, None])[:, 0]
        torch.testing.assert_close(logp, forced[b], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(forced[b], uncached[b], rtol=1e-4, atol=1e-4)
        nll, n = nll - float(logp.sum()), n + len(rows)
    assert math.isclose(float(loss), nll / n, rel_tol=1e-4)


def test_loss_falls(tok, passages):
    torch.manual_seed(0)
    model = tiny_model(len(tok)).train()
    obj = get_objective("mass", tok)
    batches = [obj.make_batch(passages["train"][8 * k:8 * k + 8], random.Random(k)) for k in range(4)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        loss, metrics = obj.loss(model, batches[step % 4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(metrics["loss"]))
    assert statistics.mean(losses[-4:]) < statistics.mean(losses[:4]) - 0.5


# --- the command lines --------------------------------------------------------------------------------------------

def test_train_fine_tune_generate_cli(tmp_path):
    """python train.py --objective mass (pre-training, then fine-tuning), then generate.py decodes with it."""
    pairs = write_title_task(tmp_path / "train.jsonl", write_docs(tmp_path / "corpus.txt", 40))
    (tmp_path / "test.src").write_text("\n".join(src for src, _ in pairs[:3]) + "\n")
    common = TINY + ["--cache_dir", str(tmp_path / "cache"), "--objective", "mass"]
    pre, fine = tmp_path / "pre", tmp_path / "s2s"
    train.main(common + ["--data", str(tmp_path / "corpus.txt"), "--out_dir", str(pre), "--max_steps", "3"])
    train.main(common + ["--task", "seq2seq", "--init_from", str(pre / "ckpt.pt"), "--data",
                         str(tmp_path / "train.jsonl"), "--out_dir", str(fine), "--max_steps", "4"])
    hyp = tmp_path / "test.hyp"
    res = subprocess.run([sys.executable, "generate.py", "--ckpt", str(fine / "ckpt.pt"), "--input",
                          str(tmp_path / "test.src"), "--output", str(hyp), "--beam", "3", "--max_len", "6",
                          "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(hyp.read_text().split("\n")) == 4
    model, tok, obj = G.load_checkpoint(fine / "ckpt.pt")
    assert isinstance(obj, MassObjective) and obj.task == "seq2seq"

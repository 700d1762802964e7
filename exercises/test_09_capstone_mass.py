"""Grader of the capstone (a fifth objective, MASS, in exercises/capstone_mass.py): its examples, the leakage
checker on its batches in both tasks, training == decoding, then train.py and generate.py with it.

    python -m pytest exercises/test_09_capstone_mass.py             # 7-18 s on 2 CPU cores: it trains a tiny model
    UNIGEN_REFERENCE=1 python -m pytest exercises/test_09_capstone_mass.py     # grades objectives/mass.py

While a test runs, your class is registered under the name "mass" (objectives.OBJECTIVES), so that
get_objective("mass", ...), train.main(["--objective", "mass", ...]) and generate.load_checkpoint use it.
The tokenized embedded corpus is cached in .cache/exercises/ at the repository root (never in exercises/).
"""
import json
import random
import statistics
from pathlib import Path

import pytest
import torch

import generate as G
import objectives
import train
from exercises import _grading as grading
from objectives import get_objective, leakage
from objectives.masks import CTX, ORIG, PAD, PSEUDO, SPAN
from tokenizer import SPECIAL_TOKENS, WordPiece

mod = grading.load("capstone_mass")
ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "exercises"
TOK = WordPiece(list(SPECIAL_TOKENS) + ["."] + [f"w{i}" for i in range(56)])      # 64 pieces, words 7..63
EOS = TOK.eos_id
KIND_NAMES = {CTX: "CTX", ORIG: "ORIG", PSEUDO: "PSEUDO", SPAN: "SPAN", PAD: "PAD"}
TINY = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--ffn_dim", "64", "--dropout", "0",
        "--vocab_size", "400", "--seq_len", "48", "--batch_size", "8", "--log_interval", "5", "--eval_batches", "2",
        "--progress", "false", "--lr", "3e-3", "--cache_dir", str(CACHE)]


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The class under grading, registered as "mass" for the test's duration."""
    if not grading.REFERENCE:
        monkeypatch.setitem(objectives.OBJECTIVES, "mass", mod.OBJECTIVE)
    yield


def random_passages(rng, n, lo=1):
    return [[[rng.randrange(7, 64) for _ in range(rng.randint(lo, 12))] for _ in range(rng.randint(1, 4))]
            for _ in range(n)]


def lists_of_one_length(ex):
    names = ("input_ids", "position_ids", "segment_ids", "labels", "kind", "step")
    lengths = {k: len(getattr(ex, k)) for k in names}
    assert len(set(lengths.values())) == 1, f"an Example's lists must have one length, got {lengths}"


def span_of(ex):
    """The predicted tokens in the order of their factorization step (step), then position."""
    rows = sorted((ex.step[r], ex.position_ids[r], r) for r in range(len(ex)) if ex.labels[r] != -100)
    return [ex.labels[r] for _, _, r in rows]


def test_registered_as_mass():
    rng = random.Random(6)
    examples = {"pretrain": random_passages(rng, 3), "seq2seq": [([11, 12], [13, 14, 15]), ([16], [17])]}
    for task in ("pretrain", "seq2seq"):
        obj = get_objective("mass", TOK, task=task)
        assert isinstance(obj, mod.OBJECTIVE) and obj.name == "mass", \
            "get_objective('mass', ...) must build your class (OBJECTIVE = MassObjective at the end of the file)"
        batch = obj.make_batch(examples[task], rng)
        assert len(batch) == len(examples[task]), f"{task}: every example must give a row of the batch"


def test_pretraining_examples():
    """The labels are one contiguous span of about half the passage, in order; the context holds the rest of
    the passage and never a token of the span (Figure 1: the encoder's input has [M] there)."""
    obj = get_objective("mass", TOK)
    rng = random.Random(0)
    shares, starts = [], set()
    for passage in random_passages(rng, 60):
        ex = obj.pretrain_example(passage, rng)
        assert ex is not None, f"a passage of {sum(map(len, passage))} tokens was skipped"
        lists_of_one_length(ex)
        kinds = {ex.kind[r] for r in range(len(ex)) if ex.labels[r] != -100}
        assert kinds == {ORIG}, \
            f"the rows with a label are of kind {sorted(KIND_NAMES.get(k, k) for k in kinds)}, but the span's rows " \
            "are the target part, kind ORIG (step t on the t-th row): a row of kind CTX is context, which every " \
            "token sees, so the decoder would read the span there"
        flat = [t for s in passage for t in s]
        span = span_of(ex)
        where = [u for u in range(len(flat) - len(span) + 1) if flat[u:u + len(span)] == span]
        assert span and where, f"passage {flat}: the predicted tokens {span} (in the order of their steps) are " \
                               "not one contiguous span of it, left to right"
        context = [t for t, k in zip(ex.input_ids, ex.kind) if k == CTX and t not in TOK.special_ids]
        assert any(context == flat[:u] + flat[u + len(span):] for u in where), \
            f"passage {flat}, span {span}: the context's text is {context}, but it must be the passage without " \
            "the span (the span's slots [MASK]: a kept or random token there would show the decoder its answer, " \
            "or noise the checker cannot tell from text)"
        rows = sorted((ex.step[r], r) for r in range(len(ex)) if ex.labels[r] != -100)
        fed = [ex.input_ids[r] for _, r in rows]
        assert fed == [TOK.sos_id] + span[:-1], \
            f"passage {flat}, span {span}: the span's rows hold {fed}, but they must hold the span shifted right by " \
            f"one, {[TOK.sos_id] + span[:-1]} ([SOS] first): a row that holds the token it predicts reads its " \
            "answer (Figure 1: the decoder's input is the span shifted right)"
        slots = [p for p, t, k in zip(ex.position_ids, ex.input_ids, ex.kind) if k == CTX and t == TOK.mask_id]
        at = [ex.position_ids[r] for _, r in rows]
        assert at == slots, \
            f"passage {flat}: the span's rows sit at positions {at}, but the row that predicts x_p sits at x_p's " \
            f"own position, the [MASK] slot's ({slots}: text token i is at position i + 1, after [SOS])"
        assert PAD not in ex.kind and CTX in ex.kind, "an Example has a context part (CTX) and no padding (PAD)"
        shares.append(len(span) / len(flat))
        starts.add(where[0])
    assert abs(statistics.mean(shares) - 0.5) < 0.1, \
        f"the span covers {statistics.mean(shares):.0%} of a passage on average; span_frac is 0.5 (MASS: about half)"
    assert len(starts) > 3, "the span always starts at the same place: draw its start with rng"


def test_span_frac_option():
    rng = random.Random(1)
    passages = random_passages(rng, 40, lo=6)
    for frac in (0.25, 0.75):
        obj = get_objective("mass", TOK, span_frac=frac)
        shares = [len(span_of(obj.pretrain_example(p, rng))) / sum(map(len, p)) for p in passages]
        assert abs(statistics.mean(shares) - frac) < 0.1, \
            f"span_frac={frac}: your spans cover {statistics.mean(shares):.0%} of a passage"


def test_empty_passage_is_skipped():
    obj = get_objective("mass", TOK)
    assert obj.pretrain_example([[]], random.Random(0)) is None and obj.skipped, \
        "an empty passage gives None and is counted with self.count_skip(reason)"


def check_leak_free(batch, task):
    model = grading.tiny_model(len(TOK), n_layer=3)
    n_pred = int((batch.labels != -100).sum())
    assert n_pred > 0, f"{task}: the batch predicts nothing (every label is -100)"
    report = leakage.check(model, batch)
    if report.leaks:
        b = report.leaks[0].example
        raise AssertionError(f"{task}: " + grading.leak_message(report, grading.describe(
            batch.kind[b], batch.step[b], {ORIG: "target-side row of step {b}"}), model))


def test_leak_free_pretraining():
    obj = get_objective("mass", TOK)
    rng = random.Random(2)
    for seed in range(3):
        check_leak_free(obj.make_batch(random_passages(rng, 3), random.Random(seed)), "pre-training")


def test_leak_free_fine_tuning():
    obj = get_objective("mass", TOK, task="seq2seq")
    rng = random.Random(3)
    pairs = [([rng.randrange(7, 64) for _ in range(rng.randint(0, 9))],
              [rng.randrange(7, 64) for _ in range(rng.randint(0, 6))]) for _ in range(4)]
    check_leak_free(obj.make_batch(pairs, random.Random(0)), "fine-tuning")


def test_fine_tuning_is_the_decoding_loop():
    """Each target token's log-probability in your training batch == what generate.py's loop gives it when it
    decodes that target (teacher forcing through generate.score_targets)."""
    torch.manual_seed(0)
    model = grading.tiny_model(len(TOK), max_position=64)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)                      # peaked: a wrong visibility changes the scores clearly
    obj = get_objective("mass", TOK, task="seq2seq", max_len=64)
    rng = random.Random(4)
    srcs = [[rng.randrange(7, 64) for _ in range(n)] for n in (4, 11, 0)]
    tgts = [[rng.randrange(7, 64) for _ in range(n)] for n in (6, 3, 2)]
    forced = G.score_targets(model, obj, srcs, [t + [EOS] for t in tgts])
    batch = obj.make_batch(list(zip(srcs, tgts)), random.Random(0))
    assert len(batch) == 3, "every (source, target) pair must give an example"
    with torch.no_grad():
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)
    query = TOK.token_to_id(obj.query_token) if obj.query_token else None
    seen = set()
    for b, r in (batch.labels != -100).nonzero().tolist():
        S = len(srcs[b]) + 2
        t = int(batch.position_ids[b, r]) - S
        if t < 0 or (query is not None and batch.input_ids[b, r] != query):
            continue                                     # a context row, or not a decoding query
        source = dict(hidden=h[b:b + 1, :S], ids=batch.input_ids[b:b + 1, :S], mask=torch.ones(1, S, dtype=bool))
        with torch.no_grad():
            logp = float(obj.decode_logprobs(model, h[b, r][None], source)[0, batch.labels[b, r]])
        assert t < len(forced[b]), f"example {b}: row {r} at position {S + t} predicts beyond the target"
        assert logp == pytest.approx(float(forced[b][t]), abs=1e-4), \
            f"example {b}, target step {t} (row {r}, position {S + t}): your training batch gives log P = " \
            f"{logp:.4f}, generate.py's decoding loop {float(forced[b][t]):.4f}: the model sees something else in " \
            "training than in decoding (ids, positions, segments or visibility; Hint 1)"
        seen.add((b, t))
    want = {(b, t) for b, y in enumerate(tgts) for t in range(len(y) + 1)}
    assert seen == want, f"steps predicted in training {sorted(seen)} != every target token and the final [EOS] " \
                         f"{sorted(want)}"
    with torch.no_grad():
        loss, metrics = obj.loss(model, batch)
    mean_nll = -sum(float(forced[b][t]) for b, t in want) / len(want)
    assert float(loss) == pytest.approx(mean_nll, abs=1e-4), \
        f"the loss {float(loss):.4f} is not the mean negative log-likelihood {mean_nll:.4f} of the target tokens"
    assert "loss" in metrics


def valid_losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "valid"]


def test_train_fine_tune_and_generate(tmp_path):
    """python train.py --objective mass on the embedded corpus (the loss falls), fine-tuning on the embedded
    task, then generate.py decodes with the fine-tuned checkpoint."""
    get_objective("mass", TOK).make_batch(random_passages(random.Random(5), 2), random.Random(0))   # fails fast
    pre, fine = tmp_path / "pre", tmp_path / "s2s"
    train.main(TINY + ["--objective", "mass", "--out_dir", str(pre), "--max_steps", "60", "--eval_interval", "10"])
    losses = valid_losses(pre)
    assert losses[-1] < losses[0] - 0.25, \
        f"held-out loss at steps 10, 20, ...: {[round(x, 3) for x in losses]}: it should fall clearly in 60 steps"
    train.main(TINY + ["--objective", "mass", "--task", "seq2seq", "--init_from", str(pre / "ckpt.pt"),
                       "--out_dir", str(fine), "--max_steps", "6", "--eval_interval", "6"])
    model, tok, obj = G.load_checkpoint(fine / "ckpt.pt")
    assert isinstance(obj, mod.OBJECTIVE) and obj.task == "seq2seq"
    sources = [tok.encode("Return the sum of two numbers."), tok.encode("Open a file and return a stream.")]
    out = G.generate(model, obj, sources, beam_size=3, max_len=8, n_best=2)
    assert len(out) == 2 and all(len(h) == 2 for h in out), f"generate gave {out}"
    for hyps in out:
        for ids, score in hyps:
            assert score < 0 and len(ids) <= 8 and all(i not in tok.special_ids - {tok.unk_id} for i in ids)
    texts = G.generate_text(model, tok, obj, ["Return the sum of two numbers."], beam_size=2, max_len=8)
    assert isinstance(texts[0], str)


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach objectives/mass.py; then one case."""
    grading.written_by_you(mod)
    obj = get_objective("mass", TOK, task="pretrain")
    assert obj.pretrain_example([[11, 12, 13, 14]], random.Random(0)) is not None, \
        "a passage of 4 tokens gives an Example"

"""train.py --eval_decode N: each evaluation decodes N held-out sources with the run's beam settings, scores them
(ROUGE-1/2/L, or BLEU-4) into metrics.jsonl, and keeps the best as best.pt, which generate.py reads; a resumed run
keeps the best score. evaluate.py rouge --sent_sep's ROUGE-Lsum is in tests/test_evaluate.py."""
import json

import pytest
import torch

import data
import evaluate as E
import generate as G
import train
from utils import UsageError

FLAGS = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--ffn_dim", "64",
         "--batch_size", "4", "--log_interval", "1", "--eval_interval", "2", "--eval_batches", "1",
         "--progress", "false", "--lr", "3e-3", "--objective", "unilm", "--task", "seq2seq", "--max_position", "128",
         "--eval_decode", "4", "--eval_beam", "2", "--eval_max_len", "8"]


@pytest.fixture(scope="module")
def task(tmp_path_factory, cache_dir, tok):
    folder = tmp_path_factory.mktemp("task")
    pairs = data.default_seq2seq(cache_dir)
    for split, n in (("train", 48), ("valid", 6)):
        rows = [json.dumps({"src": s[:300], "tgt": t}) for s, t in pairs[split][:n]]
        (folder / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    tok.save(folder / "vocab.txt")
    return folder


def run(task, out, *flags):
    train.main(FLAGS + ["--data", str(task / "train.jsonl"), "--vocab", str(task / "vocab.txt"), "--out_dir",
                        str(out), "--cache_dir", str(out.parent / "cache"), *flags])
    return out


def decoded(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == "valid_decode"]


def test_each_evaluation_decodes_scores_and_keeps_the_best(task, tmp_path, capsys, monkeypatch):
    """A tiny model's ROUGE is 0 after six steps: the real scores are raised by 10, 30, 20 at the three evaluations,
    so that the best is the second's; best.pt is the model that decoded what was scored there."""
    seen = []
    score = train.decode_scores

    def raised(preds, refs, metric):
        seen.append((preds, refs))
        return {k: v + (10, 30, 20)[len(seen) - 1] for k, v in score(preds, refs, metric).items()}

    monkeypatch.setattr(train, "decode_scores", raised)
    out = run(task, tmp_path / "run", "--max_steps", "6")
    printed = capsys.readouterr().out
    assert "step 4: valid decode of 4 sources (beam 2): rouge1 " in printed and "; best so far: best.pt" in printed
    assert "step 6: valid decode of 4 sources (beam 2): " in printed and "; best 30.00 at step 4" in printed
    rows = decoded(out)
    assert [r["step"] for r in rows] == [2, 4, 6] and [r["best"] for r in rows] == [10, 30, 30]
    assert all(set(r) >= {"rouge1", "rouge2", "rougeL", "sources"} and r["sources"] == 4 for r in rows)
    best = torch.load(out / "best.pt", weights_only=True)
    assert best["best"] == {"metric": "rougeL", "score": rows[1]["rougeL"], "step": 4}
    assert best["step"] == 4 and "optimizer" not in best and "data_state" not in best
    assert torch.load(out / "ckpt.pt", weights_only=True)["best"] == best["best"]
    # best.pt decodes the held-out sources into what was scored at step 4, with that score
    model, tok, objective = G.load_checkpoint(str(out / "best.pt"))
    pairs = data.prepare_seq2seq(str(task / "train.jsonl"), tok, str(tmp_path / "cache"), progress=False)["valid"]
    hyps = G.generate(model, objective, [s for s, _ in pairs[:4]], beam_size=2, max_len=8)
    preds = [tok.decode(h[0][0], skip_special=True) for h in hyps]
    refs = [tok.decode(t, skip_special=True) for _, t in pairs[:4]]
    assert (preds, refs) == seen[1] and all(preds)
    assert 100 * E.rouge(preds, refs, stem=True)["rougeL"]["fmeasure"] + 30 == pytest.approx(best["best"]["score"])
    # generate.py reads it, and the run's last words point at it
    G.main(["--ckpt", str(out / "best.pt"), "--input", str(task / "valid.jsonl"), "--output",
            str(tmp_path / "valid.hyp"), "--beam", "2", "--max_len", "8", "--device", "cpu"])
    assert len((tmp_path / "valid.hyp").read_text().split("\n")) == 7
    assert f"python generate.py --ckpt {out / 'best.pt'}" in printed


def test_a_resumed_run_keeps_the_best_score(task, tmp_path):
    straight = run(task, tmp_path / "straight", "--max_steps", "6")
    half = run(task, tmp_path / "half", "--max_steps", "6", "--stop_at", "4")
    run(task, half, "--max_steps", "6", "--resume")
    assert decoded(straight) == decoded(half)
    a = torch.load(straight / "best.pt", weights_only=True)
    b = torch.load(half / "best.pt", weights_only=True)
    assert a["best"] == b["best"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_bleu_where_the_task_asks_and_bad_settings(task, tmp_path):
    out = run(task, tmp_path / "bleu", "--max_steps", "2", "--eval_metric", "bleu")
    (row,) = decoded(out)
    assert "bleu" in row and "rougeL" not in row
    assert torch.load(out / "best.pt", weights_only=True)["best"]["metric"] == "bleu"
    with pytest.raises(UsageError, match="--eval_metric 'meteor': choose rouge or bleu"):
        run(task, tmp_path / "x", "--eval_metric", "meteor")
    with pytest.raises(UsageError, match="--eval_beam must be >= 1"):
        run(task, tmp_path / "x", "--eval_beam", "0")
    with pytest.raises(UsageError, match="--eval_decode decodes held-out sources: it needs --task seq2seq"):
        train.main(["--task", "pretrain", "--eval_decode", "3"])


def test_without_eval_decode_no_decoding_runs(task, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "decode_step", lambda *a: pytest.fail("decoded without --eval_decode"))
    out = run(task, tmp_path / "plain", "--max_steps", "2", "--eval_decode", "0")
    assert not (out / "best.pt").exists() and decoded(out) == []

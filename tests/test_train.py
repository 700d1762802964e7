"""train.py end to end on a tiny corpus: exact resume, DDP under torchrun, bad settings and bad losses."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pydoc_data.topics
import pytest
import torch

import train
from utils import UsageError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--ffn_dim", "64",
        "--vocab_size", "400", "--seq_len", "48", "--batch_size", "4", "--log_interval", "1", "--eval_interval", "4",
        "--eval_batches", "2", "--progress", "false", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents of CPython's own docs, a blank line between documents."""
    folder = tmp_path_factory.mktemp("corpus")
    topics = sorted(pydoc_data.topics.topics.items())[:40]
    (folder / "docs.txt").write_text("\n\n".join(" ".join(text.split())[:1500] for _, text in topics))
    return folder


def run(args, tmp_path, corpus, name):
    out = tmp_path / name
    train.main(TINY + ["--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache")] + args)
    return out


def losses(out, split="train"):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == split}


@pytest.mark.parametrize("objective", ["unilm", "pmlm"])
def test_resume_continues_exactly(tmp_path, corpus, objective):
    straight = run(["--objective", objective, "--max_steps", "8"], tmp_path, corpus, "straight")
    half = run(["--objective", objective, "--max_steps", "8", "--stop_at", "4"], tmp_path, corpus, "resumed")
    assert max(losses(half)) == 4
    run(["--objective", objective, "--max_steps", "8", "--resume"], tmp_path, corpus, "resumed")
    a, b = losses(straight), losses(half)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in range(1, 9):
        assert a[step] == b[step], (step, a[step], b[step])
    wa = torch.load(straight / "ckpt.pt", weights_only=False)["model"]
    wb = torch.load(half / "ckpt.pt", weights_only=False)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_checkpoint_is_complete_and_loss_falls(tmp_path, corpus):
    out = run(["--objective", "unilm", "--max_steps", "30", "--lm_type", "bidirectional", "--nsp", "false"],
              tmp_path, corpus, "run")
    ck = torch.load(out / "ckpt.pt", weights_only=False)
    for key in ("model", "optimizer", "step", "model_config", "vocab", "train_config", "rng", "data_state"):
        assert key in ck
    assert ck["step"] == 30 and ck["vocab"][:7] == ["[PAD]", "[UNK]", "[SOS]", "[EOS]", "[MASK]", "[P]", "[ATTN]"]
    tr = losses(out)
    first, last = sum(tr[s] for s in range(1, 6)) / 5, sum(tr[s] for s in range(26, 31)) / 5
    assert last < first - 0.5, (first, last)
    assert not list(out.glob("*.tmp"))                      # atomic writes leave no temp file behind


def test_unknown_setting_is_refused():
    with pytest.raises(UsageError, match="unknown setting --n_layers"):
        train.main(["--n_layers", "3"])
    with pytest.raises(UsageError, match="choose one of"):
        train.main(["--objective", "gpt"])
    with pytest.raises(UsageError, match="expects a int"):
        train.main(["--max_steps", "many"])


def test_incompatible_checkpoint_is_refused_with_the_difference(tmp_path, corpus):
    run(["--objective", "unilm", "--max_steps", "2"], tmp_path, corpus, "a")
    with pytest.raises(UsageError, match="n_layer: checkpoint 1 vs now 2"):
        run(["--objective", "unilm", "--max_steps", "4", "--resume", "--n_layer", "2"], tmp_path, corpus, "a")
    with pytest.raises(UsageError, match="was a unilm/pretrain run"):
        run(["--objective", "pmlm", "--max_steps", "4", "--resume"], tmp_path, corpus, "a")


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, corpus, monkeypatch, capsys):
    from objectives import unilm
    real_loss = unilm.UniLMObjective.loss
    calls = {"n": 0}

    def poisoned(self, model, batch):
        loss, metrics = real_loss(self, model, batch)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 4 else loss), metrics

    monkeypatch.setattr(unilm.UniLMObjective, "loss", poisoned)
    with pytest.raises(SystemExit):
        run(["--objective", "unilm", "--max_steps", "10", "--ckpt_interval", "2"], tmp_path, corpus, "nan")
    err = capsys.readouterr().err
    assert "non-finite loss nan at step 4" in err and "first example starts" in err
    assert torch.load(tmp_path / "nan" / "ckpt.pt", weights_only=False)["step"] == 2


def test_torchrun_ddp_two_cpu_ranks_stay_identical(tmp_path, corpus):
    """`torchrun --nproc_per_node 2 train.py --objective pmlm` on CPU (gloo): runs, syncs, replicas identical."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           str(ROOT / "train.py"), "--objective", "pmlm", "--max_steps", "4", "--device", "cpu", *TINY,
           "--data", str(corpus), "--out_dir", str(tmp_path / "ddp"), "--cache_dir", str(tmp_path / "cache")]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "-> identical" in res.stdout
    assert "2 process(es)" in res.stdout
    ck = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=False)
    assert ck["step"] == 4 and len(ck["data_state"]) == 2

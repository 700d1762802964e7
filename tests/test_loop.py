"""The fine-tune -> generate -> evaluate loop for every objective, through the command lines users run."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import evaluate
import train
from tests.helpers import tiny_model, write_docs, write_title_task
from tests.test_train import TINY

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny corpus and a tiny seq2seq task (first sentence of a help topic -> its title)."""
    d = tmp_path_factory.mktemp("loop")
    pairs = write_title_task(d / "train.jsonl", write_docs(d / "corpus.txt", 40))
    (d / "test.src").write_text("\n".join(src for src, _ in pairs[:4]) + "\n\n")
    (d / "test.tgt").write_text("\n".join(tgt for _, tgt in pairs[:4]) + "\n\n")
    return d


def cli(*args):
    res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.parametrize("objective", ["unilm", "pmlm", "ernie_gen", "palm"])
def test_pretrain_finetune_generate_evaluate(workdir, objective, capsys):
    common = TINY + ["--cache_dir", str(workdir / "cache"), "--objective", objective]
    pre, fine = workdir / f"{objective}-pre", workdir / f"{objective}-s2s"
    train.main(common + ["--data", str(workdir / "corpus.txt"), "--out_dir", str(pre), "--max_steps", "3"])
    train.main(common + ["--task", "seq2seq", "--init_from", str(pre / "ckpt.pt"), "--data",
                         str(workdir / "train.jsonl"), "--out_dir", str(fine), "--max_steps", "6"])
    # the last words name what to run next on the user's own data, not on the embedded task
    next_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert next_line == (f"next: python generate.py --ckpt {fine / 'ckpt.pt'} --input "
                         f"{workdir / 'train.jsonl'} --output {fine / 'train.hyp'} --beam 5")
    ck = torch.load(fine / "ckpt.pt", weights_only=False)
    assert ck["task"] == "seq2seq" and ck["objective"] == objective
    hyp = workdir / f"{objective}.hyp"
    cli("generate.py", "--ckpt", str(fine / "ckpt.pt"), "--input", str(workdir / "test.src"), "--output", str(hyp),
        "--beam", "3", "--max_len", "8", "--device", "cpu")
    lines = hyp.read_text().split("\n")
    assert len(lines) == len((workdir / "test.src").read_text().split("\n"))   # the blank source stays in place
    scores = json.loads(cli("evaluate.py", "rouge", "--pred", str(hyp), "--ref", str(workdir / "test.tgt"), "--json"))
    assert 0.0 <= scores["rouge1"]["fmeasure"] <= 1.0
    out = json.loads(cli("evaluate.py", "perplexity", "--ckpt", str(fine / "ckpt.pt"), "--data",
                         str(workdir / "train.jsonl"), "--device", "cpu", "--json"))
    assert out["pairs"] == 40 and 1.0 < out["perplexity"] < 2 * len(ck["vocab"])


def test_perplexity_is_the_exponent_of_the_objectives_own_loss(tok, pairs):
    """With noise and smoothing off, the fine-tuning loss is the mean target NLL the decoder sees."""
    from objectives import get_objective
    model = tiny_model(len(tok), rel_pos_buckets=32)
    obj = get_objective("pmlm", tok, task="seq2seq", max_len=512, target_noise_prob=0.0)
    examples = pairs["valid"][:6]
    import random
    with torch.no_grad():
        loss, _ = obj.loss(model, obj.make_batch(examples, random.Random(0)))
        ppl = evaluate.perplexity(model, obj, examples, batch_size=4)
    assert math.isclose(ppl, math.exp(float(loss)), rel_tol=1e-4)


def test_embedded_task_exports_as_files(tmp_path, cache_dir):
    """`python data.py export` writes what train.py, generate.py and evaluate.py read, line counts aligned."""
    import data
    counts = data.export_seq2seq(tmp_path, cache_dir)
    assert counts["test"] > 50 and counts["train"] > 1000
    src = (tmp_path / "test.src").read_text().splitlines()
    tgt = (tmp_path / "test.tgt").read_text().splitlines()
    pairs = data.read_seq2seq(tmp_path / "test.jsonl")
    assert len(src) == len(tgt) == len(pairs) == counts["test"]
    assert [" ".join(s.split()) for s, _ in pairs] == src

"""--dtype on a CPU: bf16 and fp16 autocast train (fp16 through torch's loss scaler: skipped steps counted, its
state in the checkpoint, so a resumed run is exact), generate.py decodes in either, and a dtype the device cannot
run is one line. The choice for a given card is tested in tests/test_model.py without one; fp16 with the scaler on
a GPU is bench/check_cuda.py's."""
import functools
import json

import pytest
import torch

import generate as G
import model as M
import train
from tests.helpers import write_docs
from utils import UsageError

TINY = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--ffn_dim", "64",
        "--vocab_size", "400", "--seq_len", "48", "--batch_size", "4", "--log_interval", "2", "--eval_interval", "4",
        "--eval_batches", "1", "--progress", "false", "--lr", "3e-3", "--objective", "unilm"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    write_docs(folder / "docs.txt", 30)
    return folder


def run(tmp_path, corpus, name, *flags):
    out = tmp_path / name
    train.main(TINY + ["--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache"),
                       *flags])
    return out


def records(out, split="train"):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == split]


def test_bf16_on_a_cpu_trains_without_a_scaler(tmp_path, corpus, capsys):
    out = run(tmp_path, corpus, "bf16", "--dtype", "bf16", "--max_steps", "4")
    assert "on cpu, bf16 |" in capsys.readouterr().out
    rows = records(out)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert not any("loss_scale" in r or "skipped_steps" in r for r in rows)
    assert torch.load(out / "ckpt.pt", weights_only=True)["scaler"] == {}


def cpu_fp16_or_its_refusal(tmp_path, corpus):
    """True where this torch's CPU autocast computes in fp16; else --dtype fp16 on a CPU must be one line."""
    if "fp16" in M.cpu_autocast_dtypes():
        return True
    with pytest.raises(UsageError, match="CPU autocast does not compute in it; use --dtype fp32"):
        run(tmp_path, corpus, "refused", "--dtype", "fp16")
    return False


def test_fp16_on_a_cpu_scales_the_loss_and_resumes_exactly(tmp_path, corpus):
    if not cpu_fp16_or_its_refusal(tmp_path, corpus):
        return
    straight = run(tmp_path, corpus, "straight", "--dtype", "fp16", "--max_steps", "8")
    half = run(tmp_path, corpus, "resumed", "--dtype", "fp16", "--max_steps", "8", "--stop_at", "4")
    saved = torch.load(half / "ckpt.pt", weights_only=True)["scaler"]
    assert saved["scale"] > 0 and "_growth_tracker" in saved
    run(tmp_path, corpus, "resumed", "--dtype", "fp16", "--max_steps", "8", "--resume")
    a, b = records(straight), records(half)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [2, 4, 6, 8]
    for ra, rb in zip(a, b):
        assert (ra["loss"], ra["loss_scale"], ra["skipped_steps"]) == (rb["loss"], rb["loss_scale"],
                                                                      rb["skipped_steps"])
    wa = torch.load(straight / "ckpt.pt", weights_only=True)
    wb = torch.load(half / "ckpt.pt", weights_only=True)
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
    assert wa["scaler"] == wb["scaler"]


def test_fp16_steps_whose_gradients_overflow_are_skipped_and_counted(tmp_path, corpus, monkeypatch):
    """A scale of 2^40 makes every gradient overflow in fp16: the scaler skips the step (the weights stay) and halves
    its scale; the log counts the skipped steps and leaves their infinite norms out (NaN when every step was)."""
    if not cpu_fp16_or_its_refusal(tmp_path, corpus):
        return
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0 ** 40))
    initial = {}
    make = train.make_optimizer
    monkeypatch.setattr(train, "make_optimizer", lambda model, *a: initial.update(
        {k: v.clone() for k, v in model.state_dict().items()}) or make(model, *a))
    out = run(tmp_path, corpus, "overflow", "--dtype", "fp16", "--max_steps", "2")
    (row,) = records(out)
    assert row["skipped_steps"] == 2 and row["loss_scale"] == 2.0 ** 38
    assert row["grad_norm"] != row["grad_norm"]                            # NaN: no step was taken
    assert torch.isfinite(torch.tensor(row["loss"]))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 2 and ckpt["scaler"]["scale"] == 2.0 ** 38
    assert all(torch.equal(ckpt["model"][k], initial[k]) for k in initial)


def test_a_dtype_the_device_cannot_run_is_refused(tmp_path, corpus, monkeypatch):
    with pytest.raises(UsageError, match="--dtype 'fp8': choose auto, bf16, fp16 or fp32"):
        run(tmp_path, corpus, "fp8", "--dtype", "fp8")
    monkeypatch.setattr(M, "cpu_autocast_dtypes", lambda: ("bf16",))
    with pytest.raises(UsageError, match="CPU autocast does not compute in it; use --dtype fp32"):
        run(tmp_path, corpus, "old", "--dtype", "fp16")


def test_generate_decodes_in_the_dtype_asked(tmp_path, corpus):
    out = run(tmp_path, corpus, "pre", "--max_steps", "2")
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["task"] = "seq2seq"
    torch.save(ckpt, tmp_path / "s2s.pt")
    (tmp_path / "in.txt").write_text("the list of items\n")
    for dtype in ("fp32", "bf16"):
        G.main(["--ckpt", str(tmp_path / "s2s.pt"), "--input", str(tmp_path / "in.txt"), "--output",
                str(tmp_path / f"{dtype}.txt"), "--beam", "2", "--max_len", "4", "--device", "cpu", "--dtype", dtype])
        assert len((tmp_path / f"{dtype}.txt").read_text().split("\n")) == 2
    with pytest.raises(SystemExit) as e:
        G.main(["--ckpt", str(tmp_path / "s2s.pt"), "--input", str(tmp_path / "in.txt"), "--output",
                str(tmp_path / "x.txt"), "--dtype", "fp8"])
    assert e.value.code == 2

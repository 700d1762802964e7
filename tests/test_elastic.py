"""--resume on another number of processes continues the same run: each step keeps its shards (data.StepBatches),
shared anew as gradient accumulation. 2 processes -> 1 and 1 -> 2, stopped by SIGTERM in between, against one
uninterrupted run; a number of processes that cannot share the shards is refused in one line."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import config
from tests import test_train
from tests.test_train import TINY, finish, free_port, train_losses, wait_for_step
from utils import UsageError

ROOT = Path(__file__).resolve().parents[1]
# the fixture: 40 documents of CPython's own docs, a blank line between documents
corpus = test_train.corpus
STEPS = 30
SETTINGS = [*TINY, "--objective", "pmlm", "--max_steps", str(STEPS), "--device", "cpu", "--eval_interval", "1000"]


def launch(processes, args, out, tmp_path, corpus):
    """train.py on `processes` processes (torchrun's module above one), in a process group of its own."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                 "--master_port", free_port()] if processes > 1 else [sys.executable])
    cmd = [*launcher, str(ROOT / "train.py"), *args, "--data", str(corpus), "--out_dir", str(out),
           "--cache_dir", str(tmp_path / "cache")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, corpus):
    """The uninterrupted run: 2 processes, one shard of 4 examples each a step."""
    tmp_path = tmp_path_factory.mktemp("straight")
    finish(launch(2, SETTINGS, tmp_path / "run", tmp_path, corpus))
    return tmp_path / "run"


def stop_then_resume(before, after, first_args, tmp_path, corpus):
    """Run on `before` processes, SIGTERM once step 5 is logged (to the launcher: torchrun passes it on to its
    workers once), then --resume on `after`: -> (out_dir, the step it stopped at, the resumed run's stdout)."""
    out = tmp_path / "run"
    proc = launch(before, SETTINGS + first_args, out, tmp_path, corpus)
    wait_for_step(proc, out, 5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert "stopped by SIGTERM" in stdout, stderr[-3000:]
    stopped_at = torch.load(out / "ckpt.pt", weights_only=True)["step"]
    assert 5 <= stopped_at < STEPS
    return out, stopped_at, finish(launch(after, ["--resume"], out, tmp_path, corpus))


def same_run(out, straight):
    """Every step's logged loss and the final parameters, against the uninterrupted run's.

    Tolerance: with two shards a step, the gradients are the same two terms added in either order (DDP's mean
    g0/2 + g1/2, accumulation's gradients of loss/2), so the parameters agree to the bit; 1e-6 leaves room for a
    summation order of more shards, a few float32 roundings of parameters under 1.5 in size after 30 AdamW steps.
    The logged losses differ by the logging's arithmetic (one process averages its micro-steps' float32 losses,
    several average their float64 means): relative 1e-6 (5e-8 seen)."""
    a, b = train_losses(straight), train_losses(out)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert all(abs(a[s] - b[s]) <= 1e-6 * abs(a[s]) for s in a), [(s, a[s], b[s]) for s in a if a[s] != b[s]][:3]
    wa = torch.load(straight / "ckpt.pt", weights_only=True)
    wb = torch.load(out / "ckpt.pt", weights_only=True)
    assert wa["step"] == wb["step"] == STEPS
    assert max(float((wa["model"][k] - wb["model"][k]).abs().max()) for k in wa["model"]) <= 1e-6


def test_two_processes_resumed_on_one(tmp_path, corpus, straight):
    out, stopped_at, said = stop_then_resume(2, 1, [], tmp_path, corpus)
    assert ("resumed on 1 process(es) instead of 2: each step keeps its 2 batches of 4 examples, now "
            "--grad_accum 2 on each process") in said
    assert f"resumed at step {stopped_at} of {STEPS}" in said
    same_run(out, straight)
    # the checkpoint now records the one process and its two micro-steps
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert len(ck["data_state"]) == 1 and ck["train_config"]["grad_accum"] == 2


def test_one_process_resumed_on_two(tmp_path, corpus, straight):
    """One process with --grad_accum 2 is the uninterrupted run's two shards a step already."""
    out, _, said = stop_then_resume(1, 2, ["--grad_accum", "2"], tmp_path, corpus)
    assert ("resumed on 2 process(es) instead of 1: each step keeps its 2 batches of 4 examples, now "
            "--grad_accum 1 on each process") in said
    same_run(out, straight)


def test_processes_that_cannot_share_the_shards_are_refused(straight):
    cfg = lambda: config.TrainConfig(resume=True, out_dir=str(straight))
    given = {"resume", "out_dir"}
    with pytest.raises(UsageError, match=r"^each step of this run is 2 batch\(es\) of --batch_size 4 \(--grad_accum "
                                         r"1 on 2 process\(es\)\), which 3 processes cannot share equally: resume it "
                                         r"on 1 or 2 process\(es\)$"):
        config.start_point(cfg(), {}, {}, given, world=3)
    assert [config.start_point(cfg(), {}, {}, given, world=w)[1].grad_accum for w in (1, 2)] == [2, 1]
    # through the command line: one line from every process (torchrun then reports their exit status 2 with a
    # traceback of its own, none from the project's files), and the run is left as it was
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--master_port",
                          free_port(), str(ROOT / "train.py"), "--resume", "--out_dir", str(straight), "--device",
                          "cpu"], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0
    assert res.stderr.count("train.py: error: each step of this run is 2 batch(es)") == 3
    assert f'File "{ROOT}{os.sep}' not in res.stderr                  # a frame in the project's files
    assert json.loads((straight / "metrics.jsonl").read_text().splitlines()[-1])["step"] == STEPS

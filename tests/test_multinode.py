"""Two torchrun "nodes" on this machine, started by the README's multi-node command (c10d rendezvous on the
loopback, gloo on CPUs), end with the parameters of one node running two processes."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from tests import test_train
from tests.test_train import TINY, free_port

ROOT = Path(__file__).resolve().parents[1]
# the fixture: 40 documents of CPython's own docs, a blank line between documents
corpus = test_train.corpus
# the README's multi-node command, the same on every node: HOST:PORT is where the rendezvous listens (the first
# node to come starts it there)
MULTI_NODE = ("torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint {host}:{port} "
              "train.py --objective pmlm")
ONE_NODE = "torchrun --nproc_per_node 2 --master_port {port} train.py --objective pmlm"
SETTINGS = [*TINY, "--max_steps", "6", "--device", "cpu", "--eval_interval", "1000"]


def start(command, tmp_path, corpus, out):
    """A README command with the tiny settings, through `python -m torch.distributed.run` (torchrun's module:
    the `torchrun` script need not be on this PATH), in a process group of its own."""
    argv = command.split()
    argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    argv[argv.index("train.py")] = str(ROOT / "train.py")
    argv += [*SETTINGS, "--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def outputs(procs):
    """Every process's (stdout, stderr) once all have ended; a launcher left running is ended with its workers."""
    try:
        return [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def test_two_nodes_end_with_the_parameters_of_one_node(tmp_path, corpus):
    command = MULTI_NODE.format(host="127.0.0.1", port=free_port())
    nodes = [start(command, tmp_path, corpus, tmp_path / "nodes") for _ in range(2)]
    ended = outputs(nodes)
    assert [p.returncode for p in nodes] == [0, 0], [err[-3000:] for _, err in ended]
    said = "".join(out for out, _ in ended)
    assert "2 process(es) on cpu" in said and "-> identical" in said
    one = start(ONE_NODE.format(port=free_port()), tmp_path, corpus, tmp_path / "one")
    (_, err), = outputs([one])
    assert one.returncode == 0, err[-3000:]
    a = torch.load(tmp_path / "nodes" / "ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "one" / "ckpt.pt", weights_only=True)
    assert a["step"] == b["step"] == 6 and len(a["data_state"]) == len(b["data_state"]) == 2
    # rank r builds shard r of every step wherever it runs, and gloo adds the two ranks' gradients in either
    # order to the same bits: the parameters are equal, not only close
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])

"""train.py end to end on a tiny corpus: exact resume, DDP under torchrun, bad settings and bad losses."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pydoc_data.topics
import pytest
import torch

import train
from tests.helpers import write_docs
from utils import UsageError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--ffn_dim", "64",
        "--vocab_size", "400", "--seq_len", "48", "--batch_size", "4", "--log_interval", "1", "--eval_interval", "4",
        "--eval_batches", "2", "--progress", "false", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents of CPython's own docs, a blank line between documents."""
    folder = tmp_path_factory.mktemp("corpus")
    write_docs(folder / "docs.txt", 40)
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
    wa = torch.load(straight / "ckpt.pt", weights_only=True)["model"]
    wb = torch.load(half / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_checkpoint_is_complete_and_loss_falls(tmp_path, corpus):
    out = run(["--objective", "unilm", "--max_steps", "30", "--lm_type", "bidirectional", "--nsp", "false"],
              tmp_path, corpus, "run")
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    for key in ("model", "optimizer", "step", "model_config", "vocab", "train_config", "rng", "data_state"):
        assert key in ck
    assert ck["step"] == 30 and ck["vocab"][:7] == ["[PAD]", "[UNK]", "[SOS]", "[EOS]", "[MASK]", "[P]", "[ATTN]"]
    tr = losses(out)
    first, last = sum(tr[s] for s in range(1, 6)) / 5, sum(tr[s] for s in range(26, 31)) / 5
    assert last < first - 0.5, (first, last)
    assert not list(out.glob("*.tmp"))                      # atomic writes leave no temp file behind


def test_the_gradient_norm_before_clipping_is_logged(tmp_path, corpus, monkeypatch):
    """metrics.jsonl's grad_norm is the norm clip_grad_norm_ measured (before it clipped), each step's;
    without clipping there is none."""
    clip, norms = torch.nn.utils.clip_grad_norm_, []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda *a, **k: norms.append(clip(*a, **k)) or norms[-1])
    out = run(["--objective", "pmlm", "--max_steps", "3", "--grad_clip", "0.5"], tmp_path, corpus, "clipped")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r["grad_norm"] for r in rows if r["split"] == "train"]
    assert logged == [float(n) for n in norms] and len(logged) == 3 and min(logged) > 0.5
    out = run(["--objective", "pmlm", "--max_steps", "2", "--grad_clip", "0"], tmp_path, corpus, "unclipped")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert not any("grad_norm" in r for r in rows)


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
    with pytest.raises(SystemExit) as stopped:
        run(["--objective", "unilm", "--max_steps", "10", "--ckpt_interval", "2"], tmp_path, corpus, "nan")
    # its own exit status, which bench/study.py reads as a diverged run
    assert stopped.value.code == train.DIVERGED == 3
    err = capsys.readouterr().err
    assert "non-finite loss nan at step 4" in err and "first example starts" in err
    assert torch.load(tmp_path / "nan" / "ckpt.pt", weights_only=True)["step"] == 2


def free_port():
    """A port nobody listens on now (a fixed one collides with a second test run on the same machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_torchrun_ddp_two_cpu_ranks_stay_identical(tmp_path, corpus):
    """`torchrun --nproc_per_node 2 train.py --objective pmlm` on CPU (gloo): runs, syncs, replicas identical."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", free_port(),
           str(ROOT / "train.py"), "--objective", "pmlm", "--max_steps", "4", "--device", "cpu", *TINY,
           "--data", str(corpus), "--out_dir", str(tmp_path / "ddp"), "--cache_dir", str(tmp_path / "cache")]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "-> identical" in res.stdout
    assert "2 process(es)" in res.stdout
    ck = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=True)
    assert ck["step"] == 4 and len(ck["data_state"]) == 2


# --- crashes, signals and resume: real processes --------------------------------------------------------------

# README defaults (no --seq_len: the default the resumed run must restore), a model big enough that a step takes
# tens of milliseconds, so the test can kill the process in mid-run: STOP_AT, then STEPS - STOP_AT steps to spare
STEPS, STOP_AT = 40, 15
KILLABLE = ["--objective", "pmlm", "--n_layer", "2", "--n_embd", "64", "--n_head", "2", "--ffn_dim", "128",
            "--vocab_size", "400", "--batch_size", "16", "--log_interval", "1", "--eval_interval", "1000",
            "--eval_batches", "1", "--progress", "false", "--max_steps", str(STEPS), "--ckpt_interval", "10"]


def train_cmd(ddp=False):
    if ddp:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", free_port(),
                str(ROOT / "train.py"), "--device", "cpu"]
    return [sys.executable, str(ROOT / "train.py")]


def launch(args, tmp_path, corpus, out, ddp=False):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = train_cmd(ddp) + args + ["--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "c")]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def records(out):
    # the run may be writing its last line at this moment: only whole lines count
    text = (out / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def wait_for_step(proc, out, step, timeout=240):
    """Poll metrics.jsonl until it logs `step` (the process must still be running then)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (out / "metrics.jsonl").exists() and any(r["step"] >= step for r in records(out)):
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.01)
    raise AssertionError(f"step {step} never came")


def kill_tree(pid, sig=signal.SIGKILL):
    """Signal a process and all its descendants (torchrun may start its workers in sessions of their own)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def finish(proc, code=0):
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == code, stderr[-3000:]
    return stdout


def train_losses(out):
    steps = [r["step"] for r in records(out) if r["split"] == "train"]
    assert steps == sorted(set(steps)), "duplicate or out-of-order step records"
    return {r["step"]: r["loss"] for r in records(out) if r["split"] == "train"}


@pytest.mark.parametrize("ddp", [False, True], ids=["one-process", "ddp-gloo"])
def test_sigkill_then_resume_gives_the_same_losses(tmp_path, corpus, ddp):
    """kill -9 in mid-run, then --resume: every step's loss equals the uninterrupted run's, the log has each step
    once, and the settings (seq_len's default, max_steps, the schedule) come back from the checkpoint."""
    straight = tmp_path / "straight"
    finish(launch(KILLABLE, tmp_path, corpus, straight, ddp))
    killed = tmp_path / "killed"
    proc = launch(KILLABLE, tmp_path, corpus, killed, ddp)
    wait_for_step(proc, killed, STOP_AT)
    kill_tree(proc.pid)
    proc.communicate()
    assert max(train_losses(killed)) < STEPS
    assert torch.load(killed / "ckpt.pt", weights_only=True)["train_config"]["seq_len"] == 128
    # resume with no other flag than where the run is: everything else comes from the checkpoint
    resume = launch(["--resume"], tmp_path, corpus, killed, ddp)
    finish(resume)
    a, b = train_losses(straight), train_losses(killed)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert all(a[s] == b[s] for s in a), [(s, a[s], b[s]) for s in a if a[s] != b[s]][:3]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(tmp_path, corpus, sig):
    out = tmp_path / "run"
    proc = launch(KILLABLE, tmp_path, corpus, out)
    wait_for_step(proc, out, STOP_AT)
    proc.send_signal(sig)
    stdout = finish(proc, code=128 + sig.value)
    step = torch.load(out / "ckpt.pt", weights_only=True)["step"]
    assert STOP_AT <= step < STEPS and f"stopped by {sig.name}: {step} of {STEPS} steps" in stdout
    command = next(line for line in stdout.splitlines() if line.startswith("continue with: "))
    assert command.endswith(f"train.py --resume --out_dir {out}")
    # the printed command continues the run to its end
    finish(launch(["--resume"], tmp_path, corpus, out))
    assert sorted(train_losses(out)) == list(range(1, STEPS + 1))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_stops_cleanly_with_workers(tmp_path, corpus, sig):
    """Ctrl-C in a terminal, and SIGTERM from a scheduler or `timeout`, reach every process of the
    group, the DataLoader's workers included: the workers leave it to train.py, which stops with a
    checkpoint and the resume command (exit 128 + signal), no traceback; the resumed run ends."""
    out = tmp_path / "run"
    proc = launch(KILLABLE + ["--workers", "2"], tmp_path, corpus, out)
    wait_for_step(proc, out, STOP_AT)
    os.killpg(proc.pid, sig)                               # start_new_session: its own group
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig.value, stderr[-3000:]
    assert "Traceback" not in stderr and "killed by signal" not in stderr, stderr[-3000:]
    step = torch.load(out / "ckpt.pt", weights_only=True)["step"]
    assert STOP_AT <= step < STEPS and f"stopped by {sig.name}: {step} of {STEPS} steps" in stdout
    assert f"continue with: python train.py --resume --out_dir {out}" in stdout
    finish(launch(["--resume", "--workers", "2"], tmp_path, corpus, out))
    assert sorted(train_losses(out)) == list(range(1, STEPS + 1))
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == STEPS


def test_a_finished_run_is_never_overwritten_unless_asked(tmp_path, corpus):
    out = run(["--objective", "unilm", "--max_steps", "4"], tmp_path, corpus, "done")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UsageError, match="holds the checkpoint of an earlier run"):
        run(["--objective", "unilm", "--max_steps", "4"], tmp_path, corpus, "done")
    # failing runs validate everything before they touch a file
    for bad in (["--batch_size", "0"], ["--grad_accum", "0"], ["--log_interval", "0"], ["--batch_size", "100000"],
                ["--max_steps", "0"], ["--preset", "huge"]):
        with pytest.raises(UsageError):
            run(["--objective", "unilm", "--max_steps", "4", "--overwrite", *bad], tmp_path, corpus, "done")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # told to: a new run replaces it
    run(["--objective", "unilm", "--max_steps", "2", "--overwrite"], tmp_path, corpus, "done")
    assert max(train_losses(out)) == 2


def test_resume_refuses_changed_settings_and_names_them(tmp_path, corpus):
    run(["--objective", "unilm", "--max_steps", "4", "--stop_at", "2"], tmp_path, corpus, "r")
    with pytest.raises(UsageError, match=r"lr: checkpoint 0.003 vs now 0.001.*Safe to change"):
        run(["--objective", "unilm", "--max_steps", "4", "--resume", "--lr", "1e-3"], tmp_path, corpus, "r")
    with pytest.raises(UsageError, match="mask_prob: checkpoint 0.15 vs now 0.3"):
        run(["--objective", "unilm", "--max_steps", "4", "--resume", "--mask_prob", "0.3"], tmp_path, corpus, "r")
    # safe ones may change
    run(["--objective", "unilm", "--max_steps", "4", "--resume", "--log_interval", "2", "--eval_batches", "1"],
        tmp_path, corpus, "r")
    assert max(train_losses(tmp_path / "r")) == 4


def test_a_checkpoint_without_its_resume_state_is_refused_on_resume(tmp_path, corpus):
    """convert.py strip drops the optimizer and the data position: --resume on such a file is one line naming
    it (its weights still start a new run: --init_from)."""
    import convert
    out = run(["--max_steps", "2"], tmp_path, corpus, "full")
    stripped = convert.strip(torch.load(out / "ckpt.pt", weights_only=True))
    torch.save(stripped, out / "ckpt.pt")
    with pytest.raises(UsageError, match="holds no resume state"):
        run(["--max_steps", "4", "--resume"], tmp_path, corpus, "full")


def test_preset_with_init_from_is_refused(tmp_path, corpus):
    run(["--objective", "unilm", "--max_steps", "1"], tmp_path, corpus, "pre")
    with pytest.raises(UsageError, match="--preset small with --init_from"):
        run(["--objective", "unilm", "--max_steps", "1", "--preset", "small", "--init_from",
             str(tmp_path / "pre" / "ckpt.pt")], tmp_path, corpus, "fine")


def test_help_lists_every_setting(capsys):
    from dataclasses import fields
    import model as M
    from objectives import objective_class
    for name in ("unilm", "pmlm", "ernie_gen", "palm"):
        train.main(["--objective", name, "--help"])
        text = capsys.readouterr().out
        keys = [f.name for f in fields(train.TrainConfig)] + [f.name for f in fields(M.ModelConfig)][1:]
        keys += list(objective_class(name).option_table())
        for key in keys:
            line = next((x for x in text.splitlines() if x.startswith(f"  --{key} ")), None)
            assert line is not None and len(line.split()) >= 3, (name, key)


def test_help_into_a_reader_that_leaves_is_quiet():
    """`python train.py --help | head -1`: the reader leaves (here before the help is written, so the write
    always fails); no traceback (stderr empty)."""
    proc = subprocess.Popen([sys.executable, "train.py", "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) in (0, 1) and err == b"", err.decode()


def test_help_shows_the_values_the_run_uses(capsys):
    """The default run is the tiny preset's recipe and shape: --help says so, and says another
    preset's values when one is given."""
    def shown(*argv):
        train.main([*argv, "--help"])
        text = capsys.readouterr().out
        return {x.split()[0][2:]: x.split()[1] for x in text.splitlines() if x.startswith("  --")}
    tiny = shown()
    expected = {"vocab_size": "4096", "batch_size": "16", "max_steps": "2200", "lr": "0.001",
                "seq_len": "128", "n_layer": "2", "n_embd": "128", "rel_pos_buckets": "32"}
    assert {k: tiny[k] for k in expected} == expected
    base = shown("--preset", "base", "--objective", "palm", "--lr", "3e-4")
    assert (base["batch_size"], base["lr"], base["n_layer"], base["copy_head"]) == \
        ("32", "0.0003", "12", "True")
    assert shown("--task", "seq2seq")["label_smoothing"] == "0.1"


def test_init_from_with_another_vocab_size_is_refused(tmp_path, corpus):
    run(["--objective", "unilm", "--max_steps", "1"], tmp_path, corpus, "pre")
    with pytest.raises(UsageError, match="--vocab_size 500 with --init_from: the checkpoint's "
                                         "vocabulary has"):
        run(["--objective", "unilm", "--max_steps", "1", "--vocab_size", "500", "--init_from",
             str(tmp_path / "pre" / "ckpt.pt")], tmp_path, corpus, "fine")


def test_a_corpus_of_one_document_a_line_gets_a_flag_that_exists(tmp_path):
    lines = [" ".join(text.split())[:600] for _, text in sorted(pydoc_data.topics.topics.items())]
    one_file = tmp_path / "lines.txt"
    one_file.write_text("\n".join(lines[:40]) + "\n")
    args = TINY + ["--objective", "unilm", "--data", str(one_file), "--max_steps", "2",
                   "--cache_dir", str(tmp_path / "cache")]
    with pytest.raises(UsageError, match="add --one_document_per_line") as e:
        train.main(args + ["--out_dir", str(tmp_path / "a")])
    flags = [w for w in str(e.value).split() if w.startswith("--")]
    assert flags and all(f.strip(")").removeprefix("--") in
                         {x.name for x in fields(train.TrainConfig)} for f in flags)
    train.main(args + ["--out_dir", str(tmp_path / "b"), "--one_document_per_line"])
    assert max(losses(tmp_path / "b")) == 2


def test_progress_false_hides_the_bars_only(tmp_path, corpus, capsys):
    """--progress false: the evaluation lines and the [prediction|answer] fills still print; PALM's
    stage is no metric of the valid line (it stays in metrics.jsonl)."""
    out = run(["--objective", "palm", "--max_steps", "4", "--stage1_frac", "0.5"], tmp_path,
              corpus, "palm")
    text = capsys.readouterr().out
    valid = [x for x in text.splitlines() if ": valid " in x]
    assert len(valid) == 1 and "loss " in valid[0] and "stage" not in valid[0]
    assert "fills [prediction|answer]" in text and "  the continuation: [" in text   # PALM's query rows, named
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows if r["split"] == "train"] == [1, 1, 2, 2]


# --- bad input: one line, exit status 2 -------------------------------------------------------------------------

def bad_data(tmp_path):
    """Each a broken --data for pre-training or fine-tuning, and the words its one-line error must contain."""
    d = tmp_path / "bad"
    d.mkdir()
    (d / "empty.txt").write_text("  \n")
    (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (d / "utf16.txt").write_bytes("some text in UTF-16\n".encode("utf-16-le"))
    (d / "emptydir").mkdir()
    (d / "train.jsonl").write_text('{"src": "a", "tgt": "b"}\n{"src": "a", "tgt"\n')
    (d / "half.jsonl").write_text('{"src": "a"}\n')
    (d / "x.src").write_text("one\ntwo\n")
    (d / "x.tgt").write_text("one\n")
    return [("pretrain", d / "missing", "no such file"), ("pretrain", d / "empty.txt", "empty"),
            ("pretrain", d / "latin1.txt", "not UTF-8"), ("pretrain", d / "utf16.txt", "binary"),
            ("pretrain", d / "emptydir", r"no \*.txt files"), ("seq2seq", d / "train.jsonl", "not valid JSON"),
            ("seq2seq", d / "half.jsonl", '"src" and "tgt"'), ("seq2seq", d / "x.src", "2 lines but")]


def test_every_data_error_is_one_line(tmp_path, corpus):
    for task, path, words in bad_data(tmp_path):
        with pytest.raises(UsageError, match=words) as e:
            run(["--task", task, "--data", str(path), "--max_steps", "1"], tmp_path, corpus, "bad")
        assert "\n" not in str(e.value), str(e.value)
        assert not (tmp_path / "bad" / "metrics.jsonl").exists()


@pytest.mark.parametrize("args,words", [
    (["--batch_size", "-1"], "--batch_size must be >= 1"),
    (["--preset", "huge"], "--preset 'huge'"),
    (["--n_segment", "2", "--objective", "unilm"], "uses 6 segment ids"),
    (["--data", "/no/such/place"], "no such file"),
    (["--init_from", "/no/such.pt"], "--init_from /no/such.pt: no such file"),
    (["--task", "seq2seq", "--data", "/no/such.jsonl"], "--data /no/such.jsonl: no such file"),
    (["--max_step", "10"], "unknown setting --max_step; did you mean --max_steps?"),
    (["--seq_len", "2"], "--seq_len 2 is too small for pmlm"),
    (["--seq_len", "4", "--objective", "unilm"], "need --seq_len >= 5"),
    (["--init_from", "train.py"], "not a unigen checkpoint"),
    (["--graph", "true", "--device", "cpu"], "--graph true replays CUDA graphs: it needs a CUDA device"),
    (["--graph", "yes"], "--graph 'yes': choose auto, true or false"),
    (["--attn_impl", "flex", "--device", "cpu"], "--attn_impl flex trains on CUDA only"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, args, words):
    res = subprocess.run([sys.executable, "train.py", *args, "--cache_dir", str(tmp_path), "--out_dir",
                          str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: ") and words in last
    # advice a command-line user can follow: never PyTorch's "load with weights_only=False"
    assert "weights_only" not in res.stderr
    # refused before any data is read: nothing cached, nothing written
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_run_says_where_it_resumed(tmp_path, corpus, capsys):
    run(["--max_steps", "4", "--stop_at", "2"], tmp_path, corpus, "half")
    capsys.readouterr()
    run(["--max_steps", "4", "--resume"], tmp_path, corpus, "half")
    assert f"resumed at step 2 of 4 ({tmp_path / 'half' / 'ckpt.pt'})" in capsys.readouterr().out


def test_warnings_are_one_line_without_library_internals():
    """train.py, generate.py and evaluate.py print a warning as `script.py: warning: ...` alone: no file path of a
    library, no source line such as `return func(*args, **kwargs)`."""
    code = ("import warnings, utils; utils.one_line_warnings('train.py'); "
            "warnings.warn('ernie_gen: no span vocabulary given', stacklevel=1)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.stderr == "train.py: warning: ernie_gen: no span vocabulary given\n"


def test_a_missing_file_is_named_before_the_other_checks(tmp_path, corpus):
    """A typo in --init_from or --data is reported as the missing file, not as what follows from it (here: an
    --out_dir that holds a finished run's checkpoint)."""
    run(["--max_steps", "1"], tmp_path, corpus, "done")
    for flag, path in (("--init_from", tmp_path / "done" / "ckpt.pth"), ("--data", tmp_path / "corpus.tx")):
        with pytest.raises(UsageError, match=f"{flag} {path}: no such file"):
            run(["--max_steps", "1", flag, str(path)], tmp_path, corpus, "done")


class Boobytrap:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))                   # creating the marker file proves code ran


@pytest.mark.parametrize("how", ["init_from", "resume"])
def test_a_booby_trapped_checkpoint_runs_no_code(tmp_path, how):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "o" / "ckpt.pt"
    evil.parent.mkdir()
    torch.save({"model": Boobytrap(str(marker)), "model_config": {}, "vocab": [], "objective": "pmlm"}, evil)
    args = ["--init_from", str(evil), "--out_dir", str(tmp_path / "new")] if how == "init_from" else \
        ["--resume", "--out_dir", str(evil.parent)]
    res = subprocess.run([sys.executable, "train.py", *args, "--cache_dir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "refused" in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not marker.exists()
    # the same file loaded the unsafe way would have run it: the test is not vacuous
    torch.load(evil, weights_only=False)
    assert marker.exists()


def test_batches_built_in_worker_processes_are_the_same(tmp_path, corpus):
    """--workers 2 (a DataLoader's processes build the batches, as on a GPU machine) gives the losses of
    --workers 0 (built in the training process): a step's batch depends only on (seed, rank, step)."""
    here = run(["--objective", "palm", "--max_steps", "8", "--workers", "0", "--stage1_frac", "0.5"],
               tmp_path, corpus, "here")
    there = run(["--objective", "palm", "--max_steps", "8", "--workers", "2", "--stage1_frac", "0.5"],
                tmp_path, corpus, "there")
    assert losses(here) == losses(there) and sorted(losses(here)) == list(range(1, 9))


def test_cpu_optimizer_over_all_tensors_at_once_gives_the_one_at_a_time_numbers(tmp_path, corpus, monkeypatch):
    """On a CPU, AdamW and the gradient clipping run foreach (every tensor in one call, fewer Python
    steps): the losses and the weights are those of torch's one-tensor-at-a-time loop, bit for bit."""
    fast_run = run(["--objective", "pmlm", "--max_steps", "8"], tmp_path, corpus, "foreach")
    made = []

    class LoopAdamW(torch.optim.AdamW):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("foreach"))
            super().__init__(*args, **{**kwargs, "foreach": False})

    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.optim, "AdamW", LoopAdamW)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, max_norm, foreach=None: clip(params, max_norm, foreach=False))
    loop_run = run(["--objective", "pmlm", "--max_steps", "8"], tmp_path, corpus, "loop")
    # train.py asked for foreach; the loop run had it turned off
    assert made == [True]
    assert losses(fast_run) == losses(loop_run) and sorted(losses(fast_run)) == list(range(1, 9))
    wa = torch.load(fast_run / "ckpt.pt", weights_only=True)["model"]
    wb = torch.load(loop_run / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

"""bench/study.py --tiny: the study's code end to end on a CPU (pre-training at equal corpus tokens, a control,
fine-tuning, decoding, scores, the table), and resumable: a second run recomputes nothing."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_study_runs_end_to_end_and_resumes(tmp_path):
    cmd = [sys.executable, "bench/study.py", "--tiny", "--out", str(tmp_path)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "0 cells done, 3 to run" in first.stdout
    study = json.loads((tmp_path / "study.json").read_text())
    systems = {r["system"] for r in study["rows"]}
    assert systems == {"pmlm", "palm", "pmlm/no pre-training"}
    assert all(0 <= r["mean"] <= 100 for r in study["rows"])
    # equal compute: the two objectives read the same number of corpus tokens, in different numbers of steps
    cells = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "cells").glob("*.json")}
    assert "pretrain" not in cells["pmlm_no-pre-training-s0"]
    assert cells["pmlm-s0"]["pretrain"]["steps"] != cells["palm-s0"]["pretrain"]["steps"]
    assert all(c["pretrain"]["flops"] > 0 for k, c in cells.items() if "no-pre" not in k)
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "3 cells done, 0 to run" in second.stdout
    assert "| pmlm | docsum | rougeL |" in second.stdout

"""The exercises' contract, cheaply: every grader has its stub, the graders stay out of this suite, the copy
check accuses on what a file imports and calls (never on its names), the class grader grades a small fixture
class, and exercises/verify.py checks both directions (here on one quick grader; CI runs it on all: .ci/run)."""
import configparser
import os
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"


def test_every_grader_grades_a_stub_through_the_switch():
    graders = sorted(EXERCISES.glob("test_*.py"))
    assert len(graders) >= 9
    for grader in graders:
        stub = re.search(r'grading\.load\("(\w+)"\)', grader.read_text())
        assert stub, f"{grader.name} must load the code it grades with _grading.load (the UNIGEN_REFERENCE switch)"
        assert (EXERCISES / f"{stub.group(1)}.py").exists()
        # the switch's side (read, not imported: nothing here may write into exercises/, bytecode included)
        key = (EXERCISES / "solutions" / "__init__.py").read_text()
        assert re.search(rf"^{stub.group(1)} = ", key, re.M), f"exercises/solutions/ lacks {stub.group(1)}"
    assert not (EXERCISES / "reference.py").exists(), "the answer key lives in exercises/solutions/ only"


def test_the_graders_are_not_collected_by_the_projects_tests():
    ini = configparser.ConfigParser()
    ini.read(ROOT / ".pytest.ini")
    assert ini["pytest"]["testpaths"].split() == ["tests"]


def test_verify_checks_both_directions():
    res = subprocess.run([sys.executable, "exercises/verify.py", "08"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert re.search(r"test_08_rouge_l +reference: \d+ passed.*stub: \d+ failed", res.stdout), res.stdout
    assert "copied work is flagged and passes nothing" in res.stdout, res.stdout


def test_the_switch_says_it_grades_the_solutions():
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "exercises/test_02b_unilm_bonus.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "UNIGEN_REFERENCE": "1", "PYTHONDONTWRITEBYTECODE": "1",
                              "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})      # as verify.py runs the graders
    assert res.returncode == 0, res.stdout[-2000:]
    first = res.stdout.strip().splitlines()[0]
    assert "graded: the solutions, not your files" in first, res.stdout[:1000]


# --- the copy check: honest work is never accused, shortcuts always are -------------------------------------------

def check(source, exercise):
    sys.path.insert(0, str(ROOT))
    from exercises import _copycheck
    return _copycheck.verdict(_copycheck.check_source(source, exercise))


@pytest.mark.parametrize("exercise, source", [
    # issue 19, item 7: the names of the project's functions, as local variables
    ("ex02_unilm_mask", "import torch\ndef seq2seq_mask(n_src, n, L):\n    i = torch.arange(L)[:, None]\n"
                        "    bidirectional = torch.arange(L)[None] < n_src\n"
                        "    left_to_right = torch.arange(L)[None] <= i\n"
                        "    return bidirectional | left_to_right\n"),
    ("ex08_rouge_l", "from evaluate import rouge_tokenize\ndef rouge_l(p, r):\n    rouge = {}\n    _lcs_table = 1\n"
                     "    rouge_scores = rouge_tokenize(p)\n    return rouge\n"),
    ("ex04_pseudo_mask", "from objectives.masks import CTX, ORIG, PAD, PSEUDO\ndef pseudo_masked(kind, step):\n"
                         "    return kind\npseudo_masked_mask = pseudo_masked\n"),
    ("ex06_pointer", "import torch\nx = getattr(torch, 'zeros')\nimport torch.nn.functional as F\n"),
    ("capstone_mass", "from objectives import Example, Objective, lm_loss, option\n"),
])
def test_honest_work_is_not_accused(exercise, source):
    assert check(source, exercise) == ""


@pytest.mark.parametrize("exercise, source, verdict", [
    ("ex02_unilm_mask", "from exercises.solutions import ex02_unilm_mask\n", "copied"),
    ("ex02_unilm_mask", "from . import solutions\n", "copied"),
    ("ex02_unilm_mask", "from objectives.unilm import unilm_kinds\n", "copied"),       # a re-export of masks
    ("ex02_unilm_mask", "import objectives.masks as m\nq = m\nf = q.seq2seq\n", "copied"),
    ("ex02_unilm_mask", "from objectives.masks import *\n", "copied"),
    ("ex03_blockwise", "import objectives\nf = getattr(objectives.pmlm, 'blockwise_masking')\n", "copied"),
    ("ex05_span_flow", "import importlib\nm = importlib.import_module('objectives.masks')\nf = m.multi_flow\n",
     "copied"),
    ("ex07_beam_step", "x = __import__('generate').gnmt_penalty\n", "copied"),
    ("ex08_rouge_l", "import nltk\n", "copied"),
    ("ex08_rouge_l", "from sacrebleu import BLEU\n", "copied"),
    ("ex08_rouge_l", "from rouge_score import rouge_scorer\n", "copied"),
    ("ex01_wordpiece", "import tokenizer\ndef f(w, v):\n    return tokenizer.WordPiece(v)._wordpiece(w)\n", "copied"),
    ("ex06_pointer", "from model import PointerGenerator as P\nmixture_logprobs = P.mix\n", "copied"),
    ("capstone_mass", "from objectives.mass import MassObjective\n", "copied"),
    ("ex02_unilm_mask", "import importlib\nm = importlib.import_module('objectives.' + 'masks')\n", "cannot check"),
    ("ex02_unilm_mask", "from objectives import masks\nf = getattr(masks, 'seq' + '2seq')\n", "cannot check"),
    ("ex02_unilm_mask", "exec('x = 1')\n", "cannot check"),
    ("ex02_unilm_mask", "f = eval('1')\n", "cannot check"),
    ("ex02_unilm_mask", "m = __import__('obj' + 'ectives')\n", "cannot check"),
])
def test_shortcuts_are_caught(exercise, source, verdict):
    assert check(source, exercise) == verdict


def test_the_stubs_and_the_honest_student_are_not_accused():
    sys.path.insert(0, str(ROOT))
    from exercises import _copycheck
    files = [*EXERCISES.glob("ex0*.py"), EXERCISES / "capstone_mass.py",
             *(EXERCISES / "class_fixture" / "honest").glob("*.py")]
    assert len(files) == 17
    for f in files:
        assert _copycheck.check_file(f, f.stem) == [], f


def test_a_students_own_file_is_checked_through(tmp_path):
    """Exercise 5 may reuse the student's exercise 2, but not to launder masks.seq2seq through it."""
    sys.path.insert(0, str(ROOT))
    from exercises import _copycheck
    (tmp_path / "ex05_span_flow.py").write_text("from exercises.ex02_unilm_mask import seq2seq_mask\n")
    shutil.copy(EXERCISES / "class_fixture" / "honest" / "ex02_unilm_mask.py", tmp_path)
    assert _copycheck.check_file(tmp_path / "ex05_span_flow.py", "ex05_span_flow") == []
    shutil.copy(EXERCISES / "class_fixture" / "copied_project" / "ex02_unilm_mask.py", tmp_path)
    found = _copycheck.check_file(tmp_path / "ex05_span_flow.py", "ex05_span_flow")
    assert _copycheck.verdict(found) == "copied" and "through ex02_unilm_mask.py" in str(found[0]), found


# --- grading a class --------------------------------------------------------------------------------------------

def test_grade_a_class(tmp_path):
    """honest, wrong, copied and hanging students on exercises 2 and 8: one row each, in CSV and Markdown."""
    for who in ("honest", "wrong", "copied_key", "hanging"):
        shutil.copytree(EXERCISES / "class_fixture" / who, tmp_path / "class" / who)
    res = subprocess.run([sys.executable, "exercises/grade_class.py", str(tmp_path / "class"), "--out",
                          str(tmp_path / "report"), "--exercises", "02_", "08", "--timeout", "5"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(tmp_path / "report.csv") as f:
        rows = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}
    assert len(rows) == 8 and (tmp_path / "report.md").read_text().count("\n| ") == 10
    for ex in ("02_unilm_mask", "08_rouge_l"):
        honest = rows["honest", ex]
        assert honest["passed"] == honest["total"] != "0" and not honest["flag"], honest
        copied = rows["copied_key", ex]
        assert copied["flag"] == "copied" and copied["passed"] == "0" and "exercises.solutions" in \
            copied["why flagged"], copied
    assert "precision and recall are swapped" in rows["wrong", "08_rouge_l"]["first failure"]
    assert rows["wrong", "02_unilm_mask"]["first failure"].startswith("test_the_picture")
    assert "timed out after 5 s" in rows["hanging", "02_unilm_mask"]["first failure"]
    hanging8 = rows["hanging", "08_rouge_l"]                  # the hang in exercise 2 costs only exercise 2
    assert hanging8["passed"] == hanging8["total"] != "0", hanging8


def test_grade_class_says_one_line_for_a_bad_folder(tmp_path):
    res = subprocess.run([sys.executable, "exercises/grade_class.py", str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert res.stderr.startswith("grade_class.py: error: ") and "is not a folder" in res.stderr

"""The exercises' contract, cheaply: every grader has its stub, the graders stay out of this suite, the copy
check accuses only what a file provably reaches (never its names, never a likeness), no hint quotes the answer,
each typical mistake gets its own message first, the class grader reports what an instructor acts on, and
exercises/verify.py checks both directions (here on one quick grader; CI runs it on all: .ci/run).

The class fixtures live in tests/class_fixtures/: students/ (one folder per student: honest work, work written
from the stubs' hints alone, copies of every kind, wrong, hanging and crashing work) and mistakes/ (per exercise,
typical wrong variants, each naming in its docstring the words its first failure message must hold).
"""
import configparser
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"
FIXTURES = ROOT / "tests" / "class_fixtures"
STUDENTS = FIXTURES / "students"
STUBS = sorted(EXERCISES.glob("ex0*.py")) + [EXERCISES / "capstone_mass.py"]
sys.path.insert(0, str(ROOT))
from exercises import _copycheck, _similarity  # noqa: E402  (after the project is on the path)


def grader_of(stub):
    """The main grader of a stub (the bonus grader of exercise 2 aside)."""
    return next(g for g in sorted(EXERCISES.glob("test_*.py"))
                if f'grading.load("{stub}")' in g.read_text() and "OPTIONAL = True" not in g.read_text())


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
    assert not (EXERCISES / "class_fixture").exists(), "the class fixtures live in tests/class_fixtures/ only"


def test_the_graders_are_not_collected_by_the_projects_tests():
    ini = configparser.ConfigParser()
    ini.read(ROOT / ".pytest.ini")
    assert ini["pytest"]["testpaths"].split() == ["tests"]


def test_the_stubs_are_handed_out_unsolved_and_clean():
    """A committed stub raises NotImplementedError (verify.py checks its grader fails it) and reaches nothing."""
    assert len(STUBS) == 9
    for stub in STUBS:
        assert "raise NotImplementedError" in stub.read_text(), f"{stub.name} is solved: hand out the stub"
        assert _copycheck.check_file(stub, stub.stem) == [], stub


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


# --- the copy check: it accuses what a file provably reaches, with the line, and nothing else -----------------

def findings(source, exercise):
    return _copycheck.check_source(source, exercise)


@pytest.mark.parametrize("exercise, source", [
    # the names of the project's functions, as local variables
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
    # what the check cannot prove, it does not report: names computed at run time, exec of a built string
    ("ex02_unilm_mask", "import importlib, sys\nm = importlib.import_module(sys.argv[0])\nf = getattr(m, input())\n"),
    ("ex02_unilm_mask", "code = ''.join(reversed('2qes'))\nexec(code)\n"),
    # a string that is not a path to an answer
    ("ex03_blockwise", "NOTE = 'see objectives/pmlm.py for the project, after you are done'\n"),
])
def test_honest_work_is_not_accused(exercise, source):
    assert findings(source, exercise) == []


@pytest.mark.parametrize("exercise, source, line, what", [
    ("ex02_unilm_mask", "from exercises.solutions import ex02_unilm_mask\n", 1, "the answer key"),
    ("ex02_unilm_mask", "import torch\nfrom . import solutions\n", 2, "the answer key"),
    ("ex02_unilm_mask", "from objectives.unilm import unilm_kinds\n", 1, "the project's implementation"),
    ("ex02_unilm_mask", "import objectives.masks as m\nq = m\nf = q.seq2seq\n", 3, "the project's implementation"),
    ("ex02_unilm_mask", "from objectives.masks import *\n", 1, "the project's implementation"),
    ("ex03_blockwise", "import objectives\nf = getattr(objectives.pmlm, 'blockwise_masking')\n", 2, "implementation"),
    ("ex05_span_flow", "import importlib\nm = importlib.import_module('objectives.' + 'masks')\nf = m.multi_flow\n",
     3, "the project's implementation"),
    ("ex07_beam_step", "x = __import__('gene' 'rate').gnmt_penalty\n", 1, "the project's implementation"),
    ("ex07_beam_step", "import generate\nNAME = 'beam' + '_search'\nf = generate.__dict__[NAME]\n", 3,
     "the project's implementation"),
    ("ex05_span_flow", "import sys\nf = sys.modules['objectives.masks'].multi_flow\n", 2, "implementation"),
    ("ex08_rouge_l", "import evaluate\ndef f(a, b):\n    return globals()['evaluate']._lcs_table(a, b)\n", 3,
     "the project's implementation"),
    ("ex04_pseudo_mask", "from objectives import masks\nf = eval('masks.pseudo_masked')\n", 2, "implementation"),
    ("ex03_blockwise", "exec('from objectives.pmlm import blockwise_masking')\n", 1, "the project's implementation"),
    ("ex08_rouge_l", "import nltk\n", 1, "a library that computes the answer"),
    ("ex08_rouge_l", "from rouge_score import rouge_scorer\n", 1, "a library that computes the answer"),
    ("ex01_wordpiece", "import tokenizer\ndef f(w, v):\n    return tokenizer.WordPiece(v)._wordpiece(w)\n", 3,
     "the project's implementation"),
    ("ex06_pointer", "import torch\nfrom model import PointerGenerator as P\nmix = P.mix\n", 2, "implementation"),
    ("capstone_mass", "from objectives.mass import MassObjective\n", 1, "the project's implementation"),
    ("capstone_mass", "import runpy\nm = runpy.run_path('objectives/mass.py')\n", 2, "objectives/mass.py"),
    ("ex03_blockwise", "from tests.class_fixtures.students.honest.ex03_blockwise import blockwise_masking\n", 1,
     "the class fixtures"),
    ("ex03_blockwise", "import sys\nsys.path.insert(0, 'tests/class_fixtures/students/honest')\n", 2,
     "the class fixtures"),
    ("ex01_wordpiece", "from exercises.test_01_wordpiece import project\n", 1, "a grader"),
])
def test_shortcuts_are_caught_with_their_line(exercise, source, line, what):
    found = findings(source, exercise)
    assert found and found[0].line == line and what in str(found[0]), found
    assert f"line {line} reaches" in _copycheck.message(found, exercise).splitlines()[0]


def test_the_students_of_the_fixture_class():
    """Every file of an honest student, and the copies the check cannot prove (pasted, then rewritten), reach
    nothing; every file of a copied_* student is caught, with its line."""
    for folder in sorted(STUDENTS.iterdir()):
        for f in sorted(folder.glob("*.py")):
            found = _copycheck.check_file(f, f.stem)
            if folder.name.startswith("copied"):
                assert found and found[0].line > 0, f
            else:
                assert found == [], (f, found)


def test_a_students_own_file_is_checked_through(tmp_path):
    """Exercise 5 may reuse the student's exercise 2, but not to launder masks.seq2seq through it."""
    (tmp_path / "ex05_span_flow.py").write_text("from exercises.ex02_unilm_mask import seq2seq_mask\n")
    shutil.copy(STUDENTS / "honest" / "ex02_unilm_mask.py", tmp_path)
    assert _copycheck.check_file(tmp_path / "ex05_span_flow.py", "ex05_span_flow") == []
    shutil.copy(STUDENTS / "copied_project" / "ex02_unilm_mask.py", tmp_path)
    found = _copycheck.check_file(tmp_path / "ex05_span_flow.py", "ex05_span_flow")
    assert found and "(your ex02_unilm_mask.py's line 6: objectives.masks.seq2seq)" in str(found[0]), found


def test_the_check_runs_in_threads():
    """grade_class.py checks students in threads: four files that import four different modules of objectives/,
    checked at once in a fresh interpreter, get the findings a check one at a time gets; and a check that imports a
    grader, which checks a file as it is imported, does not wait on itself."""
    files = [STUDENTS / "copied_project" / f"{stub}.py"
             for stub in ("ex02_unilm_mask", "ex03_blockwise", "ex05_span_flow", "capstone_mass")]
    script = f"""if True:
        import json, sys, threading
        sys.path.insert(0, {str(ROOT)!r})
        from exercises import _copycheck
        files, found = {[str(f) for f in files]!r}, {{}}
        start = threading.Barrier(len(files))
        def check(f):
            start.wait()
            found[f] = [list(x[:2]) for x in _copycheck.check_file(f, f.split("/")[-1][:-3])]
        threads = [threading.Thread(target=check, args=(f,)) for f in files]
        [t.start() for t in threads]
        [t.join() for t in threads]
        _copycheck._resolve("exercises.test_02_unilm_mask")
        print(json.dumps(found))
    """
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    one_at_a_time = {str(f): [list(x[:2]) for x in _copycheck.check_file(f, f.stem)] for f in files}
    assert json.loads(res.stdout) == one_at_a_time
    assert all(one_at_a_time.values())


# --- the stubs: hints that guide without quoting, references that exist ----------------------------------------

def guidance(path):
    """[(line, text)] of every hint and TODO of a stub (comments and docstring), its continuation lines joined."""
    out, current = [], None
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        body = text.lstrip("#").strip() if text.startswith("#") else text
        if re.match(r"(Hint \d|TODO)", body):
            current = [no, body]
            out.append(current)
        elif current is not None and body and (text.startswith("#") or raw.startswith("    ")):
            current[1] += " " + body
        else:
            current = None
    return [tuple(c) for c in out]


def answer_lines(exercise):
    """(where, code without spaces) of every line of the answer's functions: the project's implementation and the
    answer key's entry."""
    import inspect
    import types

    from exercises import solutions
    objects = [obj for name in _copycheck.answers(exercise) if (obj := _copycheck._resolve(name)[1]) is not None]
    key = getattr(solutions, exercise)
    objects += list(vars(key).values()) if isinstance(key, types.SimpleNamespace) else [key]
    out = []
    for obj in objects:
        obj = inspect.unwrap(obj) if callable(obj) else obj
        try:
            path = Path(inspect.getsourcefile(obj)).resolve()
            lines, start = inspect.getsourcelines(obj)
        except (OSError, TypeError):
            continue
        if ROOT in path.parents:
            out += [(f"{path.relative_to(ROOT)}:{start + k}", re.sub(r"\s+", "", line.split("#")[0]))
                    for k, line in enumerate(lines)]
    return out


@pytest.mark.parametrize("stub", STUBS, ids=lambda p: p.stem)
def test_no_hint_quotes_the_answer(stub):
    """A hint guides; it never holds a line of the answer's function (spaces aside; lines of 16 characters or
    more: `return None` is no answer)."""
    answer = answer_lines(stub.stem)
    assert answer, stub
    for no, text in guidance(stub):
        flat = re.sub(r"\s+", "", text)
        quoted = [(where, code) for where, code in answer if len(code) >= 16 and code in flat]
        assert not quoted, f"{stub.name} line {no} quotes {quoted[0][0]}: {quoted[0][1]}"


@pytest.mark.parametrize("stub", STUBS, ids=lambda p: p.stem)
def test_every_reference_in_a_stub_exists(stub):
    """The files a stub names exist, and so do the notebook parts its "Read first:" names in quotes; it cites no
    numbered points of a docstring."""
    text = stub.read_text()
    for path in re.findall(r"\b((?:notebooks|docs|objectives|exercises)/[\w/.]+\.(?:ipynb|md|py))", text):
        assert (ROOT / path).exists(), f"{stub.name} names {path}, which does not exist"
    read_first = re.sub(r"\s+", " ", text.split("Read first:")[1].split("Grade it:")[0])
    named = re.findall(r"\b((?:notebooks|docs|objectives)/[\w/.]+\.(?:ipynb|md|py))", read_first)
    texts = ["".join(c["source"]) for nb in named if nb.endswith(".ipynb")
             for c in json.loads((ROOT / nb).read_text())["cells"] if c["cell_type"] == "markdown"]
    texts += [(ROOT / path).read_text() for path in named if not path.endswith(".ipynb")]
    prose = re.sub(r"\s+", " ", " ".join(texts))
    for part in re.findall(r'"([^"]+)"', read_first):
        assert part in prose, f"{stub.name}: no file its 'Read first' names has a part {part!r}"
    assert not re.search(r"\bpoints? \d", text), f"{stub.name} cites numbered points"


# --- diagnoses: each typical mistake gets its own message first -------------------------------------------------

# A pytest plugin for a folder of graders beside files to grade: after a grader's first failure the rest of its
# tests are skipped, and the first failure of each folder is written out
FIRST_FAILURE = '''
import json, os, pytest
FIRST, COUNTS = {}, {}

def _key(item):
    return item.path.parent.name

def pytest_runtest_setup(item):
    if _key(item) in FIRST:
        pytest.skip("after the first failure")

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    key = _key(item)
    if report.when == "call":
        COUNTS[key] = COUNTS.get(key, 0) + 1
    if report.failed and key not in FIRST:
        crash = getattr(report.longrepr, "reprcrash", None)
        FIRST[key] = f"{item.name}: " + (crash.message if crash is not None else str(report.longrepr))

def pytest_sessionfinish(session):
    with open(os.environ["FIRST_FAILURES"], "w") as f:
        json.dump({"first": FIRST, "ran": COUNTS}, f)
'''


def first_failures(cases, tmp_path):
    """{label: (stub, source)} -> ({label: first failure message}, {label: tests run}), in ONE pytest process:
    each file beside its own copy of its grader (exercises/_grading.py loads the file beside the grader)."""
    for label, (stub, source) in cases.items():
        folder = tmp_path / label
        folder.mkdir()
        shutil.copy(grader_of(stub), folder)
        (folder / f"{stub}.py").write_text(source)
    (tmp_path / "conftest.py").write_text(FIRST_FAILURE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\nfilterwarnings =\n"
                                         "    ignore::DeprecationWarning\n")
    out = tmp_path / "first.json"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "--import-mode=importlib", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1",
                                  PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", FIRST_FAILURES=str(out)))
    assert out.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    found = json.loads(out.read_text())
    return found["first"], found["ran"]


def test_each_typical_mistake_is_named_first(tmp_path):
    """tests/class_fixtures/mistakes/<stub>/<mistake>.py: the first failure names the mistake ("First message:"
    in its docstring); honest work of the same exercises fails nothing."""
    cases, want = {}, {}
    for f in sorted((FIXTURES / "mistakes").glob("*/*.py")):
        label = f"{f.parent.name}--{f.stem}"
        cases[label] = (f.parent.name, f.read_text())
        want[label] = re.search(r"First message: (.*?)(\"\"\"|$)", f.read_text(), re.M).group(1).strip()
    for who in ("honest", "from_hints"):
        for f in sorted((STUDENTS / who).glob("ex0*.py")):
            cases[f"{who}--{f.stem}"] = (f.stem, f.read_text())
    assert len(want) >= 45 and {c[0] for c in cases.values()} == {s.stem for s in STUBS}
    first, ran = first_failures(cases, tmp_path)
    wrong = [f"{label}: wants {want[label]!r} first, got {first.get(label, 'no failure')[:400]!r}"
             for label in want if want[label] not in first.get(label, "")]
    assert not wrong, "\n".join(wrong)
    honest = [label for label in cases if label not in want]
    assert all(label not in first and ran.get(label) for label in honest), {k: first[k] for k in honest
                                                                             if k in first}


# --- grading a class --------------------------------------------------------------------------------------------

def test_grade_a_class(tmp_path):
    """Exercises 2 (and its bonus) and 8: a status per student and exercise, a total per student, a misnamed file
    named with the file it should be, and identical or pasted code in the review section, never in the grade."""
    cls = tmp_path / "class"
    for who in ("honest", "wrong", "copied_key", "hanging", "pasted"):
        shutil.copytree(STUDENTS / who, cls / who)
    (cls / "twin").mkdir()                                # a byte-for-byte copy of a classmate's file ...
    shutil.copy(STUDENTS / "honest" / "ex02_unilm_mask.py", cls / "twin")
    shutil.copy(STUDENTS / "from_hints" / "ex08_rouge_l.py", cls / "twin" / "ex08_rougel.py")   # ... and a typo
    shutil.copy(EXERCISES / "ex02_unilm_mask.py", cls / "pasted")          # the stub, handed back untouched
    res = subprocess.run([sys.executable, "exercises/grade_class.py", str(cls), "--out", str(tmp_path / "report"),
                          "--exercises", "02", "08", "--timeout", "5"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(tmp_path / "report.csv") as f:
        rows = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}
    status = lambda who, ex: rows[who, ex]["status"]
    assert status("honest", "02_unilm_mask") == "passed 9/9" and status("honest", "08_rouge_l") == "passed 19/19"
    assert status("honest", "02b_unilm_bonus") == "passed 2/2" and rows["honest", "02b_unilm_bonus"]["optional"]
    assert status("honest", "TOTAL") == "2/2 exercises passed"
    assert status("copied_key", "02_unilm_mask") == "copied" and rows["copied_key", "02_unilm_mask"]["passed"] == "0"
    assert rows["copied_key", "02_unilm_mask"]["detail"].startswith("line 2 reaches the answer key")
    assert "precision and recall are swapped" in rows["wrong", "08_rouge_l"]["detail"]
    assert status("wrong", "02_unilm_mask").startswith("passed ") and status("wrong", "02_unilm_mask") != "passed 9/9"
    assert status("wrong", "02b_unilm_bonus") == "bonus not attempted"
    assert status("wrong", "TOTAL") == "0/2 exercises passed"
    assert status("hanging", "02_unilm_mask") == "timed out"
    assert "timed out after 5 s" in rows["hanging", "02_unilm_mask"]["detail"]
    assert status("hanging", "08_rouge_l") == "passed 19/19"         # the hang in exercise 2 costs only exercise 2
    assert status("twin", "08_rouge_l") == "missing"
    assert rows["twin", "08_rouge_l"]["detail"] == "ex08_rougel.py: did you mean ex08_rouge_l.py?"
    assert status("pasted", "02_unilm_mask") == "not attempted"
    assert status("pasted", "02b_unilm_bonus") == "bonus not attempted"
    assert status("pasted", "08_rouge_l") == "passed 19/19"           # correctness is the grade
    report = (tmp_path / "report.md").read_text()
    review = report.split("## For review")[1]
    assert "honest/ex02_unilm_mask.py and twin/ex02_unilm_mask.py: identical files" in review
    assert re.search(r"pasted/ex08_rouge_l.py table_of\(\) and evaluate.py _lcs_table\(\): the same code up to names",
                     review), review
    assert "| pasted | 1/2 exercises, 19/28 tests | not attempted | bonus not attempted | passed 19/19 |" in report


def test_grade_class_says_one_line_for_a_bad_folder(tmp_path):
    res = subprocess.run([sys.executable, "exercises/grade_class.py", str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert res.stderr.startswith("grade_class.py: error: ") and "is not a folder" in res.stderr


def test_likeness_separates_copies_from_honest_work():
    """What exercises/_similarity.py says of itself: the honest solutions of the fixtures stay below ALIKE against
    the repository and against each other; pasted code is the same up to names; pasted and rewritten is listed."""
    repo = _similarity.repository(exclude=STUDENTS.resolve())
    best = lambda fn, pool: max((_similarity.likeness(fn[3], other[3]) for other in pool), default=0.0)
    honest = {who: {f.name: _similarity.functions(f) for f in sorted((STUDENTS / who).glob("*.py"))}
              for who in ("honest", "from_hints")}
    for who, files in honest.items():
        for name, fns in files.items():
            for fn in fns:
                assert best(fn, repo) < _similarity.ALIKE, (who, name, fn[1])
    for name, fns in honest["honest"].items():
        for fn in fns:
            assert best(fn, honest["from_hints"].get(name, [])) < _similarity.ALIKE, (name, fn[1])
    pmlm = [f for f in _similarity.functions(ROOT / "objectives" / "pmlm.py") if f[1] == "blockwise_masking"]
    assert best(_similarity.functions(STUDENTS / "pasted" / "ex03_blockwise.py")[0], pmlm) == 1.0
    assert best(_similarity.functions(STUDENTS / "rewritten" / "ex03_blockwise.py")[0], pmlm) >= _similarity.ALIKE

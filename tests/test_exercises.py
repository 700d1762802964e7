"""The exercises' contract, cheaply: every grader has its stub, the graders stay out of this suite, and
exercises/verify.py checks both directions (here on one quick grader; CI runs it on all: .ci/run)."""
import configparser
import re
import subprocess
import sys
from pathlib import Path

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
        reference = (EXERCISES / "reference.py").read_text()
        assert re.search(rf"^{stub.group(1)} = ", reference, re.M), f"exercises/reference.py lacks {stub.group(1)}"


def test_the_graders_are_not_collected_by_the_projects_tests():
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    assert ini["pytest"]["testpaths"].split() == ["tests"]


def test_verify_checks_both_directions():
    res = subprocess.run([sys.executable, "exercises/verify.py", "08"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert re.search(r"test_08_rouge_l +reference: \d+ passed.*stub: \d+ failed", res.stdout), res.stdout

"""Check every exercise grader in both directions: it PASSES on the answer key and on honest work, FAILS on
the stub and on copied work.

    python exercises/verify.py              # every grader (CI runs this: .ci/run)
    python exercises/verify.py 03 09        # only the graders whose number or name contains these
    python exercises/verify.py --list       # the graders and the stubs they grade

Every exercises/test_*.py is run by pytest twice, in subprocesses from the repository root:
    reference   UNIGEN_REFERENCE=1: the grader grades the answer key (exercises/solutions/); every test
                must pass, and pytest's output must say "graded: the solutions, not your files"
    stub        the untouched student file (exercises/exNN_*.py, capstone_mass.py): pytest must report
                failures, and NO test may pass (a test that passes on an empty stub grades nothing)
Then the fixture class (exercises/class_fixture/) is graded by exercises/grade_class.py, students in isolation:
    honest      written in other words than the key (and with the names of issue 19, item 7): every test
                passes, nothing is flagged
    copied_*    the answer key, the project's answer, a reference scorer, or a dynamic trick: flagged
                ("copied" or "cannot check") and NO test passes
A grader that does neither is reported with the end of its output, and verify.py exits with status 1.
The quick graders share one pytest process per direction and the capstone has its own (torch is imported
four times, not eighteen), two processes at a time (CI has 2 cores); outcomes are read per grader from
pytest's junit XML. Nothing is written into exercises/: bytecode caches are off (PYTHONDONTWRITEBYTECODE) and
pytest's reports go to a temporary folder. The stub direction assumes untouched stubs: in a checkout where a
student solved an exercise, its stub run "passes" and is reported.
"""
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TIMEOUT = 300                 # seconds for one pytest run


def graders():
    """exercises/test_*.py, in order."""
    return sorted(HERE.glob("test_*.py"))


def outcomes(xml_path, chosen):
    """pytest's junit XML -> {grader stem: {"passed": n, "failed": n, "skipped": n, "broken": n}}.

    "broken" counts a grader that could not even be collected (an import error, say)."""
    counts = {g.stem: {"passed": 0, "failed": 0, "skipped": 0, "broken": 0, "seconds": 0.0} for g in chosen}
    if not xml_path.exists():
        return counts
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname") or case.get("name", "")          # a collection error has no classname
        stem = next((s for s in counts if module.split(".")[-1] == s or module.endswith("." + s)), None)
        if stem is None:
            continue
        tags = {child.tag for child in case}
        error = next((child for child in case if child.tag == "error"), None)
        if not case.get("classname") and error is not None:
            key = "broken"
        elif tags & {"failure", "error"}:
            key = "failed"
        else:
            key = "skipped" if "skipped" in tags else "passed"
        counts[stem][key] += 1
        counts[stem]["seconds"] += float(case.get("time", 0))
    return counts


def run(group, reference, tmp):
    """One pytest process over a group of graders -> (return code, {stem: counts}, output)."""
    # the graders need no third-party pytest plugin: not loading the installed ones (hypothesis, anyio, ...)
    # saves about a second a process
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               UNIGEN_REFERENCE="1" if reference else "0")
    xml = Path(tmp) / f"{group[0].stem}-{'reference' if reference else 'stub'}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           f"--junitxml={xml}", *(str(g.relative_to(ROOT)) for g in group)]
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        rc, output = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        rc, output = -1, f"timed out after {TIMEOUT} s\n{e.stdout or ''}"
    return rc, outcomes(xml, group), output


def judge(reference, rc, counts, output=""):
    """'' if a grader's run is what the contract asks, else why not."""
    if reference and "graded: the solutions, not your files" not in output:
        return "the switch's run does not say 'graded: the solutions, not your files'"
    if rc not in (0, 1):
        return f"pytest ended with status {rc} (2-5: interrupted, internal or usage error; -1: timed out)"
    if counts["broken"]:
        return "the grader could not be collected (an import error?)"
    if reference:
        if counts["failed"]:
            return "fails on the project's reference"
        if not counts["passed"]:
            return "passes nothing on the reference (every test skipped?)"
        return ""
    if counts["passed"]:
        return f"{counts['passed']} test(s) PASS on the untouched stub: they grade nothing"
    if not counts["failed"]:
        return "nothing fails on the stub"
    return ""


def check_class(chosen, tmp):
    """The fixture class through grade_class.py -> [(student, grader, why)] for every broken expectation."""
    students = ["honest", "copied_key", "copied_project", "copied_routes", "copied_pasted",
                "copied_dynamic"]
    folder = Path(tmp) / "class"
    for s in students:
        shutil.copytree(HERE / "class_fixture" / s, folder / s)
    names = [g.stem.removeprefix("test_") for g in chosen]
    out = Path(tmp) / "class_report"
    res = subprocess.run([sys.executable, str(HERE / "grade_class.py"), str(folder), "--out", str(out),
                          "--exercises", *names, "--timeout", "200"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"), timeout=3 * TIMEOUT)
    if res.returncode != 0:
        return [("-", "-", f"grade_class.py ended with status {res.returncode}: {res.stderr[-2000:]}")]
    bad = []
    with open(f"{out}.csv") as f:
        for row in csv.DictReader(f):
            who, grader = row["student"], row["exercise"]
            if row["first failure"] == "not submitted":
                continue                              # e.g. no honest capstone: it would train a model
            passed, total = int(row["passed"] or 0), int(row["total"] or 0)
            if who == "honest" and (row["flag"] or passed != total or not total):
                bad.append((who, grader, f"honest work: {passed}/{total} passed, flag {row['flag']!r} "
                                         f"{row['why flagged']} {row['first failure']}"))
            if who != "honest" and (not row["flag"] or passed):
                bad.append((who, grader, f"copied work: {passed}/{total} passed, flag {row['flag']!r}"))
    return bad


def summary(counts):
    return ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped", "broken") if counts[k]) or \
        "no tests"


def main(argv):
    if "--list" in argv:
        for g in graders():
            stub = re.search(r'grading\.load\("(\w+)"\)', g.read_text())
            print(f"{g.relative_to(ROOT)}  grades  exercises/{stub.group(1) if stub else '?'}.py")
        return 0
    chosen = [g for g in graders() if not argv or any(a in g.stem for a in argv)]
    if not chosen:
        print(f"verify.py: no grader matches {argv}; see --list", file=sys.stderr)
        return 2
    start = time.time()
    # pytest processes: each direction runs the capstone (it trains a model) apart from the quick graders, so
    # two workers finish together; one process per group saves importing torch eighteen times
    groups = [grp for grp in ([g for g in chosen if "capstone" in g.stem],
                              [g for g in chosen if "capstone" not in g.stem]) if grp]
    jobs = [(tuple(grp), ref) for grp in groups for ref in (True, False)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        # the fixture class alongside the graders' runs: grade_class.py grades two students at a time
        fixture = pool.submit(check_class, chosen, tmp)
        results = dict(zip(jobs, pool.map(lambda job: run(job[0], job[1], tmp), jobs)))
        class_bad = fixture.result()
    bad = []
    for (group, ref), (rc, counts, output) in results.items():
        for g in group:
            why = judge(ref, rc, counts[g.stem], output)
            if why:
                bad.append((g, ref, why, output))
    for g in chosen:
        line = [f"{g.stem:<24}"]
        for ref in (True, False):
            (rc, counts, _), = [r for (grp, r_ref), r in results.items() if g in grp and r_ref == ref]
            c = counts[g.stem]
            why = next((w for b, r_ref, w, _ in bad if b == g and r_ref == ref), "")
            line.append(f"{'reference' if ref else 'stub'}: {summary(c)} ({c['seconds']:.1f} s)"
                        f"{'  <-- ' + why if why else ''}")
        print("   ".join(line))
    shown = set()
    for g, ref, why, output in bad:
        print(f"\n--- {g.name} ({'UNIGEN_REFERENCE=1' if ref else 'stub'}): {why}")
        if id(output) not in shown:
            shown.add(id(output))
            print(f"the end of pytest's output:\n{output[-3000:]}")
    for who, grader, why in class_bad:
        print(f"\n--- fixture class, {who}, {grader}: {why}")
    if not class_bad:
        print("fixture class: honest work passes unflagged, copied work is flagged and passes nothing")
    elapsed = time.time() - start
    if bad or class_bad:
        print(f"\nverify.py: {len(bad)} of {2 * len(chosen)} grader runs and {len(class_bad)} fixture rows break "
              f"the contract ({elapsed:.0f} s)")
        return 1
    print(f"verify.py: {len(chosen)} grader(s) pass on the answer key and honest work, fail on the stub and on "
          f"copied work ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

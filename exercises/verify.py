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
Then the fixture class (tests/class_fixtures/students/) is graded by exercises/grade_class.py, students in
isolation:
    honest, from_hints   written in other words than the key, and from the stubs' hints alone: every test
                         passes, nothing is flagged
    copied_*             the answer key, the project's implementation, a library that computes the answer, the
                         class fixtures or a grader, reached by import, attribute, getattr, sys.modules, exec,
                         a path, ...: "copied", with the line, and NO test passes
A grader that does neither is reported with the end of its output, and verify.py exits with status 1.

A stub solved in this checkout (it raises NotImplementedError nowhere) cannot show that its grader fails an empty
file: verify.py says so and grades it as a solution instead (every test must pass); the rest of the check stands,
and CI runs on a clean checkout.
The quick graders share one pytest process per direction and the capstone has its own (torch is imported four
times, not eighteen), two processes at a time (CI has 2 cores); outcomes are read per grader from pytest's junit
XML. Nothing is written into exercises/: bytecode caches are off (PYTHONDONTWRITEBYTECODE) and pytest's reports
go to a temporary folder.
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
FIXTURES = ROOT / "tests" / "class_fixtures" / "students"
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


def solved(stub):
    """Whether exercises/<stub>.py is someone's solution rather than the stub: it raises NotImplementedError
    nowhere (a stub raises it in every function left to write)."""
    return "raise NotImplementedError" not in (HERE / f"{stub}.py").read_text()


def stub_of(grader):
    found = re.search(r'grading\.load\("(\w+)"\)', grader.read_text())
    return found.group(1) if found else None


def judge(reference, rc, counts, output="", is_solved=False):
    """'' if a grader's run is what the contract asks, else why not."""
    if reference and "graded: the solutions, not your files" not in output:
        return "the switch's run does not say 'graded: the solutions, not your files'"
    if rc not in (0, 1):
        return f"pytest ended with status {rc} (2-5: interrupted, internal or usage error; -1: timed out)"
    if counts["broken"]:
        return "the grader could not be collected (an import error?)"
    if reference or is_solved:
        if counts["failed"]:
            return "fails on the project's reference" if reference else \
                f"{counts['failed']} test(s) fail on the solved stub"
        if not counts["passed"]:
            return "passes nothing (every test skipped?)"
        return ""
    if counts["passed"]:
        return f"{counts['passed']} test(s) PASS on the stub: they grade nothing, or the stub is partly solved in " \
               "this checkout (it still raises NotImplementedError somewhere); run verify.py in a clean checkout"
    if not counts["failed"]:
        return "nothing fails on the stub"
    return ""


def check_class(chosen, tmp):
    """The fixture class through grade_class.py -> [(student, grader, why)] for every broken expectation."""
    students = ["honest", "from_hints", "copied_key", "copied_project", "copied_routes", "copied_tricks",
                "copied_fixture"]
    folder = Path(tmp) / "class"
    for s in students:
        shutil.copytree(FIXTURES / s, folder / s)
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
            who, grader, status = row["student"], row["exercise"], row["status"]
            if status == "missing" or grader in ("", "TOTAL"):
                continue                              # e.g. no copied capstone of every kind
            passed, total = int(row["passed"] or 0), int(row["total"] or 0)
            if not who.startswith("copied") and (status != f"passed {total}/{total}" or not total):
                bad.append((who, grader, f"honest work: {status}: {row['detail']}"))
            if who.startswith("copied") and (status != "copied" or passed):
                bad.append((who, grader, f"copied work: {status}, {passed}/{total} passed: {row['detail']}"))
    return bad


def summary(counts):
    return ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped", "broken") if counts[k]) or \
        "no tests"


def main(argv):
    if "--list" in argv:
        for g in graders():
            print(f"{g.relative_to(ROOT)}  grades  exercises/{stub_of(g) or '?'}.py")
        return 0
    chosen = [g for g in graders() if not argv or any(a in g.stem for a in argv)]
    if not chosen:
        print(f"verify.py: no grader matches {argv}; see --list", file=sys.stderr)
        return 2
    start = time.time()
    done = {g: solved(stub_of(g)) for g in chosen}
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
            why = judge(ref, rc, counts[g.stem], output, not ref and done[g])
            if why:
                bad.append((g, ref, why, output))
    for g in chosen:
        line = [f"{g.stem:<24}"]
        for ref in (True, False):
            (rc, counts, _), = [r for (grp, r_ref), r in results.items() if g in grp and r_ref == ref]
            c = counts[g.stem]
            why = next((w for b, r_ref, w, _ in bad if b == g and r_ref == ref), "")
            name = "reference" if ref else "solution" if done[g] else "stub"
            line.append(f"{name}: {summary(c)} ({c['seconds']:.1f} s){'  <-- ' + why if why else ''}")
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
    edits = sorted({f"exercises/{stub_of(g)}.py" for g in chosen if done[g]})
    if edits:
        print(f"\nsolved in this checkout (they raise NotImplementedError nowhere), so graded as solutions: every "
              f"test must pass: {', '.join(edits)}; whether their graders fail an empty stub is checked in a "
              "clean checkout (CI)")
    elapsed = time.time() - start
    if bad or class_bad:
        print(f"\nverify.py: {len(bad)} of {2 * len(chosen)} grader runs and {len(class_bad)} fixture rows break "
              f"the contract ({elapsed:.0f} s)")
        return 1
    if edits:
        n = sum(not done[g] for g in chosen)
        print(f"verify.py: {len(chosen)} grader(s) pass on the answer key and honest work and fail on copied work; "
              f"{n} fail on the untouched stub, the other {len(chosen) - n} pass on the solution in their stub's "
              f"place ({elapsed:.0f} s)")
        return 0
    print(f"verify.py: {len(chosen)} grader(s) pass on the answer key and honest work, fail on the stub and on "
          f"copied work ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

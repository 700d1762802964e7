"""Grade a class: every student's files, each student in isolation, with a time limit, into one report.

    python exercises/grade_class.py SUBMISSIONS/ --out report            # -> report.csv and report.md
    python exercises/grade_class.py SUBMISSIONS/ --out report --exercises 02 08 --timeout 120 --jobs 2

SUBMISSIONS/ holds one sub-folder per student, with files named like the stubs (ex02_unilm_mask.py, ...,
capstone_mass.py). For each student:

1. a file whose name matches no exercise is reported with the closest name ("ex05_spanflow.py: did you mean
   ex05_span_flow.py?"); it is not graded;
2. the copy check (exercises/_copycheck.py) reads each file, without running it: a file that imports or names
   the answer key, the class fixtures, the project's implementation of the exercise or a library that computes
   it is "copied", with the line;
3. a temporary copy of exercises/ (the graders, the stubs, the helpers; NOT the answer key exercises/solutions/)
   gets the student's files in place of the stubs, and pytest runs the student's graders there in a subprocess,
   the project's modules importable, UNIGEN_REFERENCE off;
4. a time limit per test: a grader still running then is "timed out", a process that dies is "crashed", and
   the graders not reached yet run again in a fresh process (one hanging exercise costs only itself).

Per student and exercise a status: "passed N/M", "copied" (with the line), "missing", "not attempted" (the
untouched stub), "does not import", "crashed", "timed out"; an optional grader (OPTIONAL = True in it, the
bonus of exercise 2) is marked as such and stays out of the total. Per student a total: the exercises passed in
full and the tests passed, optional graders aside. A separate review section lists identical and near-identical
code, between students and between a student and a file of the repository (exercises/_similarity.py: a measure
that names do not change); it is for the instructor to read, never a failure. Ctrl-C writes the report of the
students done so far. The capstone trains a model (7-18 s a student on 2 CPU cores; leave it out with
--exercises).
"""
import argparse
import csv
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from exercises import _copycheck, _similarity  # noqa: E402  (after the project is on the path)

LOAD_LIMIT = 300             # seconds for pytest to import the files and collect, on a busy machine
COLUMNS = ("student", "exercise", "file", "status", "passed", "total", "optional", "detail")

# A pytest plugin, written next to the student's copy: one JSON line per test started and per outcome, flushed
# at once, so that a run killed at its time limit still says what it finished and where it hung
LOG_PLUGIN = '''
import json, os, threading
LOG = open(os.environ["UNIGEN_CLASS_LOG"], "a", buffering=1)
LIMIT = float(os.environ["UNIGEN_CLASS_LIMIT"])
_timer = [None]

def _write(**row):
    LOG.write(json.dumps(row) + "\\n")

def pytest_runtest_logstart(nodeid, location):
    _write(event="start", nodeid=nodeid)
    def expire():                       # a test past its limit: say so, and end the process
        _write(event="timeout", nodeid=nodeid)
        os._exit(124)
    _timer[0] = threading.Timer(LIMIT, expire)
    _timer[0].daemon = True
    _timer[0].start()

def pytest_runtest_logfinish(nodeid, location):
    _timer[0].cancel()

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(report.longrepr or "")
        _write(event="outcome", nodeid=report.nodeid, when=report.when, outcome=report.outcome, message=text)

def pytest_collectreport(report):
    if report.failed:
        _write(event="collect_error", nodeid=report.nodeid, message=str(report.longrepr)[-2000:])
'''


def fail(msg):
    print(f"grade_class.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def graders(chosen=None):
    """[(grader stem, the stub it grades, optional)], in order; `chosen` filters by number or name."""
    out = []
    for g in sorted(HERE.glob("test_*.py")):
        text = g.read_text()
        stub = re.search(r'grading\.load\("(\w+)"\)', text)
        if stub and (not chosen or any(c in g.stem for c in chosen)):
            out.append((g.stem, stub.group(1), bool(re.search(r"^OPTIONAL = True", text, re.M))))
    return out


def one_line(message):
    """The first informative line of a failure message."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    if line.endswith(":") and len(lines) > 1:            # "... the first:" announces the line that says it
        line += " " + lines[1]
    line = re.sub(r"^(AssertionError|E\s+AssertionError):\s*", "", line)
    return line[:300]


def copy_of_exercises(tmp, files):
    """tmp/exercises: the graders and helpers, the student's files in place of the stubs; no answer key."""
    dest = tmp / "exercises"
    dest.mkdir()
    for f in HERE.glob("*.py"):
        if f.name not in ("verify.py", "grade_class.py"):
            shutil.copy(f, dest / f.name)
    for name, path in files.items():
        shutil.copy(path, dest / f"{name}.py")
    (tmp / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n"
                                    "filterwarnings =\n    ignore::DeprecationWarning\n")
    (tmp / "_class_log.py").write_text(LOG_PLUGIN)
    if (ROOT / ".cache").exists():                      # the capstone's tokenized corpus, shared
        (tmp / ".cache").symlink_to(ROOT / ".cache")


def run_graders(tmp, stems, limit):
    """pytest over the graders, again on those not reached after a time-out or crash -> {stem: result}.

    A result: passed, total, failure (the first, in one line), unwritten (failures that are the stub's own
    NotImplementedError), absent (a function the file does not define), ended ("timed out" / "crashed" / "" when
    pytest finished)."""
    results, todo = {}, list(stems)
    # PYTEST_DISABLE_PLUGIN_AUTOLOAD: the graders need no third-party pytest plugin, and loading the installed
    # ones (hypothesis, anyio, ...) costs about a second a process
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(ROOT)]), UNIGEN_REFERENCE="0",
               PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               UNIGEN_CLASS_LOG=str(tmp / "log.jsonl"), UNIGEN_CLASS_LIMIT=str(limit))
    while todo:
        (tmp / "log.jsonl").write_text("")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "_class_log", "--continue-on-collection-errors",
               *(f"exercises/{s}.py" for s in todo)]
        try:
            # the plugin limits each test; this limit only catches a file that hangs while it is imported
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=LOAD_LIMIT + limit * 50)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            status = None
        rows = [json.loads(ln) for ln in (tmp / "log.jsonl").read_text().splitlines() if ln.strip()]
        per = {s: dict(passed=0, total=0, failure="", unwritten=0, absent=0, failed=0, ended="", started=False)
               for s in todo}
        last = None
        for row in rows:
            stem = Path(row["nodeid"].split("::")[0]).stem
            if stem not in per:
                continue
            r = per[stem]
            if row["event"] == "start":
                r["started"], r["total"], last = True, r["total"] + 1, stem
            elif row["event"] == "collect_error":
                r["started"], r["failure"] = True, "the grader could not load: " + one_line(row["message"])
            elif row["event"] == "timeout":
                status = "timeout"
            elif row["when"] == "call" or row["outcome"] != "passed":
                r["passed"] += row["outcome"] == "passed"
                if row["outcome"] == "failed":
                    r["failed"] += 1
                    r["unwritten"] += row["message"].startswith("NotImplementedError")
                    r["absent"] += bool(re.match(r"AttributeError: module .* has no attribute", row["message"]))
                    if not r["failure"]:
                        r["failure"] = f"{row['nodeid'].split('::')[-1]}: {one_line(row['message'])}"
        ended = {None: "timed out", "timeout": "timed out"}.get(status)
        if ended is None and status not in (0, 1, 5):
            ended = "crashed"
        why = {None: "timed out while loading the files", "timeout": f"timed out after {limit:g} s"}.get(
            status, f"crashed (exit status {status})")
        if ended and last is None:                       # no test even started: the files hang or kill on load
            for s in todo:
                results[s] = dict(per[s], failure=why, ended=ended)
            break
        for s in todo:
            if per[s]["started"] and (not ended or s != last):
                results[s] = per[s]
        if ended:
            results[last] = dict(per[last], ended=ended, failure=f"{why} in a test of {last}" +
                                 (f"; before: {per[last]['failure']}" if per[last]["failure"] else ""))
        todo = [s for s in todo if s not in results]
        if not ended:                                     # a grader that never started: report, do not loop
            for s in todo:
                results[s] = dict(per[s], failure="not run (pytest did not reach it)")
            break
    return results


def strays(folder, stubs):
    """{stub: [message]} for the files of a folder that match no exercise, under the exercise they resemble
    most (None: no exercise close enough)."""
    names = [f"{s}.py" for s in stubs]
    out = {}
    for f in sorted(folder.iterdir()):
        if f.name in names or f.name.startswith(".") or f.is_dir() or f.name == "__pycache__":
            continue
        close = difflib.get_close_matches(f.name, names, n=1, cutoff=0.6)
        if not close and f.suffix == ".py":
            number = re.match(r"(ex\d+|capstone)", f.name)
            close = [n for n in names if number and n.startswith(number.group(1))][:1]
        key = close[0][:-3] if close else None
        out.setdefault(key, []).append(f"{f.name}: did you mean {close[0]}?" if close else
                                       f"{f.name}: not an exercise file (not graded)")
    return out


def status_of(result, findings, optional):
    """(status, detail) of one graded file."""
    if findings:
        return "copied", str(findings[0])
    if result["ended"]:
        return result["ended"], result["failure"]
    if "does not import:" in result["failure"]:
        return "does not import", result["failure"].split("does not import:", 1)[1].strip()
    if result["failed"] and result["unwritten"] == result["failed"] and not result["passed"]:
        return ("bonus not attempted" if optional else "not attempted"), "the stub as handed out"
    if optional and result["failed"] and result["unwritten"] + result["absent"] == result["failed"] and \
            not result["passed"]:
        return "bonus not attempted", "the file does not define the bonus's functions"
    return f"passed {result['passed']}/{result['total']}", result["failure"]


def grade_student(folder, chosen, timeout):
    """One student's rows of the report."""
    stubs = {stub for _, stub, _ in chosen}
    files = {stub: folder / f"{stub}.py" for stub in stubs if (folder / f"{stub}.py").is_file()}
    stray = strays(folder, sorted({stub for _, stub, _ in graders()}))
    flags = {stub: _copycheck.check_file(path, stub) for stub, path in files.items()}
    with tempfile.TemporaryDirectory(prefix="grade_class_") as tmp:
        tmp = Path(tmp)
        copy_of_exercises(tmp, files)
        results = run_graders(tmp, [g for g, stub, _ in chosen if stub in files], timeout) if files else {}
    rows = []
    for grader, stub, optional in chosen:
        row = dict(student=folder.name, exercise=grader.removeprefix("test_"), file=f"{stub}.py",
                   optional="optional" if optional else "")
        if stub not in files:
            near = "; ".join(stray.get(stub, []))
            rows.append(dict(row, status="missing", passed="", total="", detail=near or "no file"))
            continue
        r = results[grader]
        status, detail = status_of(r, flags[stub], optional)
        rows.append(dict(row, status=status, passed=0 if flags[stub] else r["passed"], total=r["total"],
                         detail=detail))
    for message in stray.get(None, []):
        rows.append(dict(student=folder.name, exercise="", file=message.split(":")[0], status="not graded",
                         passed="", total="", optional="", detail=message))
    return rows


def totals(rows):
    """{student: (exercises passed in full, exercises, tests passed, tests)}, optional graders aside."""
    out = {}
    for r in rows:
        if not r["exercise"] or r["optional"]:
            continue
        t = out.setdefault(r["student"], [0, 0, 0, 0])
        t[0] += r["status"].startswith("passed") and r["passed"] == r["total"] != 0
        t[1] += 1
        t[2] += int(r["passed"] or 0)
        t[3] += int(r["total"] or 0)
    return out


def write_report(rows, out, review, students):
    """out.csv (one row per student and exercise, then one TOTAL row per student) and out.md."""
    total = totals(rows)
    with open(f"{out}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for s in students:
            w.writerows(r for r in rows if r["student"] == s)
            if s in total:
                done, n, tp, tn = total[s]
                w.writerow(dict(student=s, exercise="TOTAL", file="", status=f"{done}/{n} exercises passed",
                                passed=tp, total=tn, optional="", detail=""))
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
    exercises = list(dict.fromkeys(r["exercise"] + (" (optional)" if r["optional"] else "")
                                   for r in rows if r["exercise"]))
    lines = ["# Class report", "", "## Grades", "",
             "| student | total | " + " | ".join(exercises) + " |", "|" + " --- |" * (len(exercises) + 2)]
    for s in students:
        mine = {r["exercise"] + (" (optional)" if r["optional"] else ""): r for r in rows if r["student"] == s}
        if s not in total and not mine:
            continue
        done, n, tp, tn = total.get(s, (0, 0, 0, 0))
        lines.append(f"| {cell(s)} | {done}/{n} exercises, {tp}/{tn} tests | " +
                     " | ".join(cell(mine[e]["status"]) if e in mine else "" for e in exercises) + " |")
    lines += ["", "## Details", "", "| student | exercise | status | detail |", "| --- | --- | --- | --- |"]
    lines += [f"| {cell(r['student'])} | {cell(r['exercise'] or r['file'])} | {cell(r['status'])} | "
              f"{cell(r['detail'])} |" for r in rows if r["detail"] not in ("", "no file")]
    lines += ["", "## For review (not counted in any grade)", "",
              "Identical or near-identical code, the names aside (exercises/_similarity.py): between students, "
              "and between a student and a file of the repository. A likeness is a question for the student, "
              "not a proof; short code that everyone writes the same way is left out.", ""]
    lines += [f"- {cell(line)}" for line in review] or ["- nothing"]
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="grade_class.py", description=__doc__.split("\n")[0])
    p.add_argument("submissions", help="a folder with one sub-folder of files per student")
    p.add_argument("--out", default="report", help="the report's path without extension (.csv and .md)")
    p.add_argument("--exercises", nargs="*", default=None, help="graders by number or name (default: all)")
    p.add_argument("--timeout", type=float, default=180,
                   help="seconds for one test (the capstone's training test takes a few seconds)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="students graded at once")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    folder = Path(args.submissions)
    if not folder.is_dir():
        fail(f"{folder} is not a folder (give a folder with one sub-folder per student)")
    students = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not students:
        fail(f"{folder} has no student sub-folders")
    chosen = graders(args.exercises)
    if not chosen:
        fail(f"no grader matches {args.exercises}")
    if not Path(args.out).resolve().parent.is_dir():
        fail(f"the folder of --out {args.out} does not exist")
    if args.timeout <= 0 or args.jobs < 1:
        fail("--timeout must be > 0 and --jobs >= 1")
    done, start = {}, time.time()
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        futures = {pool.submit(grade_student, s, chosen, args.timeout): s for s in students}
        for fut in tqdm(as_completed(futures), total=len(futures), desc="students", unit="student"):
            done[futures[fut].name] = fut.result()
    except KeyboardInterrupt:
        # the students not started are dropped; the running pytest processes got the Ctrl-C too
        pool.shutdown(wait=False, cancel_futures=True)
        print(f"grade_class.py: interrupted: writing the {len(done)} student(s) done", file=sys.stderr)
    else:
        pool.shutdown()
    names = [s.name for s in students if s.name in done]
    rows = [r for s in names for r in done[s]]
    stubs = sorted({stub for _, stub, _ in chosen})
    review = _similarity.review({s: folder / s for s in names}, stubs, exclude=folder.resolve())
    write_report(rows, args.out, review, names)
    print(f"grade_class.py: {len(done)} of {len(students)} student(s), {len(chosen)} grader(s) "
          f"({time.time() - start:.0f} s), {len(review)} item(s) for review: {args.out}.csv, {args.out}.md")
    return 0 if len(done) == len(students) else 130


if __name__ == "__main__":
    sys.exit(main())

"""The repository speaks of itself, never of its making.

No ordinal of a work period, no issue or item number, no day named relative to the writer, no verdict on a goal
(PATTERNS says which words, REFERENCES gives examples) in any tracked text file: code, comments, docstrings, docs,
notebooks (sources and outputs), tests, exercises, READMEs, bench/ pages and scripts. A reader outside cannot
resolve any of them; each becomes the fact itself, a result with its topic: "1.17x faster on two H100s
(bench/RESULTS.md, DDP)". A results page says what was measured, not whether it reached a target someone set.

Scanned: every file `git ls-files` lists that reads as UTF-8 text, each file whole, so a phrase wrapped over two
lines (of prose, of a comment, of a notebook's JSON) still counts. Left out: binary files, the pictures inside
notebooks (base64 lines), and the block of this file that holds the patterns and their examples.
"""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --- the patterns and their examples (the one block of the repository the scan leaves out) ---------------------
ORDINAL = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
           "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-\\w+|thirtieth|"
           "\\d+(?:st|nd|rd|th)")
# what may stand between two words of a phrase: spaces and line ends, a comment's '#', a string's quotes and a
# notebook's JSON line end ('\n",')
GAP = r'(?:\s|#|"|\\n",?)+'
PATTERNS = {
    "a work period": rf"\b(?:{ORDINAL}|earlier|later|last|previous|next|this|that|past|prior|whole|every|both|two|"
                     rf"three|four|several|across){GAP}sessions?\b|\bsession{GAP}(?:of{GAP}\d{{4}}|\d+\b)",
    "an issue": rf"\bissues?{GAP}#?\d+\b(?![.,]\d)|\bthe{GAP}issue's",
    "a work item": rf"\bitems?{GAP}\d+\b(?![.,]\d)",
    "a day": r"(?<!\.)\b(?:today|yesterday)\b(?!\()",
    "last time": rf"\blast{GAP}time\b(?!{GAP}steps?\b)",
    "a goal or its verdict": (
        rf"\bgoals?{GAP}(?:>=?\s*)?\d+(?:\.\d+)?x\b|\bgoals?{GAP}(?:>=?\s*)?\d+\b(?![.,]\d)|\(goals?\s+[\d.]+|"
        rf"\b(?:goal|bar)s?\b[^.\n]{{0,30}}?\b(?:met|missed)\b|\bquality{GAP}bars?\b|"
        rf"\b(?:above|below|under|over|reach(?:ed|es)?|clear(?:ed|s)?|miss(?:ed|es)?){GAP}the{GAP}bars?\b|"
        rf"\b(?:not|is|are|was|were|been|now){GAP}met\b|\b(?:all|both|none){GAP}(?:\w+{GAP})?met\b|"
        rf":\s*(?:not\s+)?met\b|\d{GAP}met\b|\*\*(?:met|missed|not met)\*\*"),
}
HISTORY = re.compile("|".join(f"(?P<p{i}>{p})" for i, p in enumerate(PATTERNS.values())), re.IGNORECASE)
KINDS = list(PATTERNS)

# the examples spell the words they test with marks, so that no line of this file reads as history:
# #S session, #CS Session, #I issue, #CI Issue, #T item
MARKS = {"#CS": "Session", "#CI": "Issue", "#S": "session", "#I": "issue", "#T": "item"}


def spelled(texts):
    """texts with MARKS spelled out."""
    out = []
    for text in texts:
        for mark, word in MARKS.items():
            text = text.replace(mark, word)
        out.append(text)
    return out


REFERENCES = spelled([
    "the twentieth #S", "(bench/RESULTS.md, sixth #S)", "a later #S", "in this #S",
    "earlier #Ss", "the sixteenth #S's 4-GPU profile", "Across #Ss four GPUs", "whole #S",
    "# #CS of 2026-11-28, nineteenth", "at #S 11", "the sixth\n    # #S's",
    '"... seventh\\n",\n "#S',
    "#I 22's bar", "#Is 19-22", "(#I 3/6)", "#CI 21 #T 4", "#I 19, #T 7", "Setting (the #I's)",
    "#T 7", "#Ts 2-3",
    "measured today", "today's path", "Today we", "yesterday",
    "unlike last time", "the last\ntime",
    "bar met", "goal met", "is not met", "Goal 25: not met", "(3 / 3 seeds): met", "ROUGE-L 30 met on one GPU",
    "| **missed** |", "the quality bar is still missed", "stays below the bar", "(goal 0.95)", "goal 3.8x",
    "goal >= 30", "all eight met", "The bar that counts is met", "beam 5 >= 3x BART-base is met",
])
FACTS = spelled([
    '@pytest.fixture(scope="#S")', "Built once per test #S", "start_new_#S=True",
    "def pytest_#Sstart(#S):", "a Jupyter #S", "workers in #Ss of their own",
    "requests.#CS()", "a #S-scoped fixture",
    "Mr. Smith met J. R. Tolkien in the U.S.", "metric", "method", "metadata", "met J.",
    "bar = tqdm(total=n)", "ax.bar(x, y)", "bar.update(1)", "the error bar is the standard deviation",
    "The bar on the right", "a long blue bar", "the lead baseline is the bar to clear", "ax.barh", "each bar's score",
    "goal = math.ceil(mask_prob * n)", "Algorithm 1 stops at its goal", "(goal reached, blocks", "Learning goals",
    "stop at the FIRST block that reaches the goal", "a goal of {goal}",
    "datetime.date.today()", "date.today()", "the last time step", "at the last time steps",
    "#T 0.38 value 0.04", "for #T in #Ts", "#Ts()", "it #Is a warning", "t#I 3", "the #I is",
    "the first sentence", "the second pass", "sixth block", "the 1st token", "its own #S of work",
    "6 #Ts", "an #T",
])
# a phrase wrapped over lines, and where it is reported: the line it starts on
WRAPPED = (spelled(["one\nthe seventh\n# #S\n"])[0], [(2, spelled(["seventh # #S"])[0], "a work period")])
# --- end of the patterns and their examples -----------------------------------------------------------------------


def hits(text):
    """[(line number, matched text, kind)] of every reference to the project's history in text."""
    found = []
    for m in HISTORY.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        found.append((line, " ".join(m.group(0).split()), KINDS[int(m.lastgroup[1:])]))
    return found


def test_the_patterns_catch_references_and_pass_facts():
    missed = [text for text in REFERENCES if not hits(text)]
    assert not missed, f"references the patterns miss: {missed}"
    wrong = [(text, hits(text)) for text in FACTS if hits(text)]
    assert not wrong, f"facts the patterns take for references: {wrong}"
    text, where = WRAPPED
    assert hits(text) == where


def own_block():
    """The line numbers of this file's block of patterns and examples, by its two marker lines."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    marks = [n for n, line in enumerate(lines, 1)
             if line.startswith("# --- ") and "patterns and their examples" in line]
    assert len(marks) == 2, "test_facts.py: the block of patterns lost one of its two marker lines"
    return range(marks[0], marks[1] + 1)


def test_no_file_refers_to_the_history_of_its_making():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    this, skipped = Path(__file__).resolve(), own_block()
    report = []
    for name in sorted(listed.decode().split("\0")):
        path = ROOT / name
        if not name or not path.is_file():                # a file deleted in the working tree, not yet in git
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        lines = text.split("\n")                          # as hits() counts them
        for line, matched, kind in hits(text):
            where = lines[line - 1]
            if '"image/png"' in where or (path == this and line in skipped):
                continue
            report.append(f"{name}:{line}: {kind}: {matched!r} in: {where.strip()[:200]}")
    assert not report, (f"{len(report)} references to the project's history (state the fact itself; a result: its "
                        f"topic in bench/RESULTS.md):\n" + "\n".join(report))

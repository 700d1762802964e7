"""Likeness of code, names aside: what the class grader lists for the instructor to review (never a grade).

A function's source becomes a stream of tokens in which every name it chooses is one placeholder (keywords,
builtins, attribute names, numbers and operators stay; strings become one placeholder; comments and docstrings
go), so renaming variables changes nothing. Two streams are compared by their sets of 5-token shingles
(Jaccard: shared / all): 1.0 is the same code up to names, and reordered or rewritten code scores lower.

    identical files     two students' files equal byte for byte (the untouched stub aside)
    alike code          a function of a student and a function of another student, or of any .py file of the
                        repository (the project, the answer key, the graders, the class fixtures), with a
                        likeness >= ALIKE, both at least MIN_TOKENS long: short code (a one-line mask) is
                        written the same way by everyone and is left out. Named by its likeness: "the same up
                        to names" (1.0), "near-identical" (>= 0.8), "alike" (>= ALIKE)

tests/test_exercises.py holds the class fixtures (tests/class_fixtures/) to it: the honest solutions stay below
ALIKE against the repository and against each other; the project's code pasted and renamed is "the same up to
names", and pasted then rewritten (a for loop made a while loop, an if made a continue) is still listed.
"""
import ast
import builtins
import io
import keyword
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "exercises"
ALIKE = 0.6
MIN_TOKENS = 80
SHINGLE = 5
SKIP_DIRS = {".git", ".cache", "out", "runs", "__pycache__", ".ipynb_checkpoints", "venv", ".venv"}
KEEP = set(keyword.kwlist) | set(dir(builtins))
FIXTURES = "tests/class_fixtures/"
MISTAKES = "tests/class_fixtures/mistakes/"


def tokens(source):
    """The normalized token stream of some Python source (see the module docstring); [] if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    docs = {node.body[0].value.lineno for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)}
    out, previous = [], None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.STRING and tok.start[0] in docs and previous in (None, "\n", ">", "<", ":"):
                continue                                    # a docstring is text, not code
            if tok.type == tokenize.NAME:
                text = tok.string if tok.string in KEEP or previous == "." else "N"
            elif tok.type == tokenize.STRING:
                text = "S"
            elif tok.type == tokenize.NEWLINE:
                text = "\n"
            elif tok.type == tokenize.INDENT:
                text = ">"
            elif tok.type == tokenize.DEDENT:
                text = "<"
            else:
                text = tok.string
            out.append(text)
            previous = text
    except (tokenize.TokenError, IndentationError):
        return []
    return out


def shingles(stream):
    return {tuple(stream[i:i + SHINGLE]) for i in range(len(stream) - SHINGLE + 1)}


def likeness(a, b):
    """Jaccard of two shingle sets."""
    return len(a & b) / len(a | b) if a and b else 0.0


def functions(path, label=None):
    """[(label, function name, token count, shingles)] for every function of a file of at least MIN_TOKENS."""
    try:
        source = Path(path).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = "\n".join(lines[node.lineno - 1:node.end_lineno])
            stream = tokens(_dedent(body))
            if len(stream) >= MIN_TOKENS:
                out.append((label or str(path), node.name, len(stream), shingles(stream)))
    return out


def _dedent(text):
    width = min((len(ln) - len(ln.lstrip()) for ln in text.splitlines() if ln.strip()), default=0)
    return "\n".join(ln[width:] for ln in text.splitlines())


def repository(exclude=None):
    """The functions of every .py file of the repository but the stubs and the typical mistakes (variants of a
    class fixture), and `exclude` (the submissions)."""
    stubs = {p.resolve() for p in HERE.glob("ex*.py")} | {(HERE / "capstone_mass.py").resolve()}
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts[:-1]) or path.resolve() in stubs or str(rel).startswith(MISTAKES) or \
                exclude is not None and exclude in path.resolve().parents:
            continue
        out += functions(path, str(rel))
    return out


def words(score):
    kind = "the same code up to names" if score == 1 else "near-identical code" if score >= 0.8 else "alike code"
    return f"{kind} (likeness {score:.2f})"


def review(students, stubs, exclude=None):
    """Lines for the review section, the most alike first: {student: folder} and the exercises' stub names."""
    untouched = {stub: (HERE / f"{stub}.py").read_bytes() for stub in stubs if (HERE / f"{stub}.py").exists()}
    repo = repository(exclude)
    found, names = [], sorted(students)
    for stub in stubs:
        files = {s: students[s] / f"{stub}.py" for s in names if (students[s] / f"{stub}.py").is_file()}
        content = {s: f.read_bytes() for s, f in files.items()}
        own = {s: functions(f, f"{s}/{f.name}") for s, f in files.items()}
        same = set()
        for i, a in enumerate(files):
            for b in list(files)[i + 1:]:
                if content[a] == content[b] and content[a] != untouched.get(stub):
                    found.append((2.0, f"{a}/{stub}.py and {b}/{stub}.py: identical files"))
                    same.add((a, b))
        for i, a in enumerate(files):
            others = [f for b in list(files)[i + 1:] if (a, b) not in same for f in own[b]]
            for label, name, size, sh in own[a]:
                for other, oname, osize, osh in others:          # each other student's function
                    score = likeness(sh, osh) if 0.5 <= size / osize <= 2 else 0.0
                    if score >= ALIKE:
                        found.append((score, f"{label} {name}() and {other} {oname}(): {words(score)}"))
                # the repository: the most alike function of the project (the key, the graders included), and
                # the most alike of the class fixtures
                hits = [(likeness(sh, osh), other, oname) for other, oname, osize, osh in repo
                        if 0.5 <= size / osize <= 2]
                for fixture in (False, True):
                    part = [h for h in hits if h[1].startswith(FIXTURES) == fixture and h[0] >= ALIKE]
                    if part:
                        score, other, oname = max(part, key=lambda h: (h[0], h[1]))
                        found.append((score, f"{label} {name}() and {other} {oname}(): {words(score)}"))
    return [line for _, line in sorted(found, key=lambda f: -f[0])]

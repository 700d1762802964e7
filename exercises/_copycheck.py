"""The copy check: does a student's file reach the answer instead of computing it?

It reads the file (it never runs it) and reports only what the text proves, each time with the line:

    the answer key               exercises/solutions/ (the project's code behind each exercise's names)
    the class fixtures           tests/class_fixtures/ (solutions written to test the graders)
    the graders                  exercises/test_*.py (each computes the answer, to compare it with the student's)
    the project's implementation ANSWERS[exercise]: the code the exercise was cut from, and its twins
    a library that computes it   ANSWERS[exercise] too: rouge-score in exercise 8, tokenizers in exercise 1, ...

The file "reaches" one of them when it imports it, or names it through an imported name: an attribute chain
(`objectives.masks.seq2seq`), a simple assignment (`m = masks`), getattr, importlib.import_module, __import__,
sys.modules[...], globals()[...], vars(x)[...] or x.__dict__[...] with a string the file spells out (a constant,
constants joined by + or in an f-string, or a name assigned one), eval or exec of such a string, or a path to one
of these files written as a string. A project name is resolved to the object it is, so a re-export is its home.
The names the file chooses never count: a variable called `rouge` or `left_to_right` is the student's business.

What it cannot see, and so never reports: a name computed at run time from anything but constants (input, a
loop, a decoded string, a path built piece by piece), an object reached through another object (the copy head
of a model some function returns), code pasted in from any of the above, and work shared between students. The
class grader lists identical and near-identical files for the instructor to read (exercises/grade_class.py); a
likeness is never a failure. The check is a guard against shortcuts, not a plagiarism detector.
"""
import ast
import functools
import importlib
import sys
import threading
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

# What counts as the answer, per exercise. An entry is a dotted name; "module.*" means every function and class
# DEFINED in that module (its constants, e.g. the token kinds CTX, ORIG, ..., stay free to use). torch and the
# standard library are always fine; so are the project pieces named in ALLOWED.
ANSWERS = {
    # WordPiece's greedy encoding: the class does it (._wordpiece, .encode, .tokenize); so do Hugging Face's
    "ex01_wordpiece": ("tokenizer.WordPiece", "tokenizers", "transformers"),
    # UniLM's masks, the pseudo-masked mask, the span flow: every mask function of objectives/masks.py, and the
    # two other routes to the same rule: a Batch's attn_mask, and the fast layer's twins (fast.slot_mask, ...)
    "ex02_unilm_mask": ("objectives.masks.*", "objectives.Batch", "fast"),
    "ex03_blockwise": ("objectives.pmlm.*",),
    "ex04_pseudo_mask": ("objectives.masks.*", "objectives.Batch", "fast"),
    "ex05_span_flow": ("objectives.masks.*", "objectives.ernie_gen.*", "objectives.Batch", "fast"),
    # PALM's mixture: the head itself, also as a Transformer's copy_head (M.Transformer(cfg).copy_head.mix)
    "ex06_pointer": ("model.PointerGenerator", "model.Transformer.copy_head"),
    # the beam step: generate.py (beam_search, ban_tokens, gnmt_penalty, ...) and the fast layer's twins
    "ex07_beam_step": ("generate.*", "fast"),
    # ROUGE-L: evaluate.py's LCS and scores, and the libraries that score ROUGE
    "ex08_rouge_l": ("evaluate.*", "rouge_score", "rouge", "nltk", "sacrebleu", "torchmetrics"),
    # the capstone: the project's own MASS
    "capstone_mass": ("objectives.mass",),
}
ALLOWED = {
    "ex01_wordpiece": ("tokenizer.basic_tokenize", "tokenizer.SPECIAL_TOKENS"),
    "ex02_unilm_mask": ("objectives.masks.CTX", "objectives.masks.ORIG", "objectives.masks.PAD"),
    "ex04_pseudo_mask": ("objectives.masks.CTX", "objectives.masks.ORIG", "objectives.masks.PSEUDO",
                         "objectives.masks.PAD"),
    "ex05_span_flow": ("objectives.masks.CTX", "objectives.masks.ORIG", "objectives.masks.SPAN"),
    "ex08_rouge_l": ("evaluate.rouge_tokenize",),           # the stub gives the tokenizer
    "capstone_mass": ("objectives.Example", "objectives.Objective", "objectives.lm_loss", "objectives.option",
                      "objectives.masks", "objectives.leakage"),
}
# Never, in any exercise: the answer key, and the class fixtures (also as a folder put on the import path)
KEY = ("exercises.solutions",)
FIXTURES = ("tests.class_fixtures", "class_fixtures")
KEY_PATH, FIXTURES_PATH = ROOT / "exercises" / "solutions", ROOT / "tests" / "class_fixtures"


class Finding(NamedTuple):
    line: int
    what: str           # the dotted name, or the path, as the file reaches it
    why: str            # what it is: "the answer key", ...

    def __str__(self):
        return f"line {self.line} reaches {self.why}: {self.what}"


def _project_modules():
    """Top-level names of the project's own modules and packages (the only ones the check imports)."""
    names = {p.stem for p in ROOT.glob("*.py")}
    return names | {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}


# grade_class.py checks several students' files at once, one thread each. Two threads importing two modules of
# a package whose __init__ imports its own submodules (objectives/) can each find the other's module half made
# ("cannot import name ... from partially initialized module"): the check imports one module at a time. The lock
# is re-entrant: importing a grader runs the copy check on the file it grades (exercises/_grading.py).
_IMPORTING = threading.RLock()


def _import(name):
    with _IMPORTING:
        return importlib.import_module(name)


def _resolve(dotted):
    """A dotted name of the project -> (canonical dotted name, object), or (dotted, None) if not resolvable."""
    parts = dotted.split(".")
    if parts[0] not in _project_modules():
        return dotted, None
    obj, used = None, 0
    for k in range(len(parts), 0, -1):                  # the longest importable prefix, then attributes
        try:
            obj, used = _import(".".join(parts[:k])), k
            break
        except Exception:
            continue
    if obj is None:
        return dotted, None
    for part in parts[used:]:
        if not hasattr(obj, part):
            return dotted, None
        obj = getattr(obj, part)
    return _canonical(obj) or dotted, obj


def _canonical(obj):
    """The dotted name an object is defined under (a re-export resolves to its home)."""
    if isinstance(obj, type(sys)):
        return obj.__name__
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str) and "<" not in name:
        return f"{module}.{name}"
    return None


@functools.lru_cache(maxsize=None)
def graders():
    """The graders' modules: each computes the answer to compare a student's with (exercises.test_01_wordpiece)."""
    return tuple(f"exercises.{p.stem}" for p in sorted((ROOT / "exercises").glob("test_*.py")))


def answers(exercise):
    """The exercise's forbidden dotted names, "module.*" expanded to the functions and classes it defines."""
    out = list(KEY + FIXTURES + graders())
    for entry in ANSWERS.get(exercise, ()):
        if not entry.endswith(".*"):
            out.append(entry)
            continue
        module = _import(entry[:-2])
        out += [f"{module.__name__}.{k}" for k, v in vars(module).items()
                if callable(v) and getattr(v, "__module__", None) == module.__name__]
    return out


def answer_files(exercise):
    """The files and folders that are the answer as a whole: the key, the fixtures, whole answer modules."""
    out = [KEY_PATH, FIXTURES_PATH] + sorted((ROOT / "exercises").glob("test_*.py"))
    for entry in ANSWERS.get(exercise, ()):
        module = entry[:-2] if entry.endswith(".*") else entry
        obj = _resolve(module)[1]
        if isinstance(obj, type(sys)) and getattr(obj, "__file__", None):
            path = Path(obj.__file__).resolve()
            out.append(path.parent if path.name == "__init__.py" else path)
    return out


def kind_of(name):
    """What a forbidden dotted name is, in words."""
    if _inside(name, KEY):
        return "the answer key (exercises/solutions/)"
    if _inside(name, FIXTURES):
        return "the class fixtures (tests/class_fixtures/)"
    if _inside(name, graders()):
        return "a grader (it computes the answer, to compare it with yours)"
    if name.split(".")[0] in _project_modules():
        return "the project's implementation of this exercise"
    return "a library that computes the answer"


def _inside(dotted, names):
    """The entry of `names` that `dotted` is, or lies inside (an attribute, a submodule), else None."""
    return next((n for n in names if dotted == n or dotted.startswith(n + ".")), None)


def _text(node, consts):
    """The string an expression spells out from constants, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _text(node.left, consts), _text(node.right, consts)
        return a + b if a is not None and b is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_text(v.value if isinstance(v, ast.FormattedValue) else v, consts) for v in node.values]
        return "".join(parts) if None not in parts else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" and \
            len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):
        sep, parts = _text(node.func.value, consts), [_text(e, consts) for e in node.args[0].elts]
        return sep.join(parts) if sep is not None and None not in parts else None
    return None


class _Walker:
    """One pass over a file: the dotted name of every import, attribute chain and alias, with its line."""

    def __init__(self, tree, package, alias=None, consts=None):
        self.tree, self.package = tree, package
        self.alias, self.consts = dict(alias or {}), dict(consts or {})
        self.names = []                  # (line, dotted name) reached by the code
        self.inner = []                  # (line, source, mode) of eval / exec / compile of a spelled-out string

    def absolute(self, module, level):
        """A relative import's module, from the package the student's file sits in (exercises)."""
        if not level:
            return module
        base = self.package.split(".")[:len(self.package.split(".")) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def text(self, node):
        return _text(node, self.consts)

    def arg_text(self, call, k):
        return self.text(call.args[k]) if len(call.args) > k else None

    def dotted(self, node):
        """The dotted name an expression stands for, or None."""
        if isinstance(node, ast.Name):
            return self.alias.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            func = self.dotted(node.func)
            if name == "getattr" and self.arg_text(node, 1) is not None:
                base = self.dotted(node.args[0])
                return f"{base}.{self.arg_text(node, 1)}" if base else None
            if func == "importlib.import_module" and self.arg_text(node, 0) is not None:
                return self.absolute(self.arg_text(node, 0).lstrip("."), len(self.arg_text(node, 0)) -
                                     len(self.arg_text(node, 0).lstrip(".")))
            if name == "__import__" and self.arg_text(node, 0) is not None:
                # __import__("a.b") is the package a; with a fromlist it is the module a.b
                fromlist = len(node.args) > 3 or any(k.arg == "fromlist" for k in node.keywords)
                return self.arg_text(node, 0) if fromlist else self.arg_text(node, 0).split(".")[0]
            if name == "eval" and self.arg_text(node, 0) is not None:
                try:
                    return self.dotted(ast.parse(self.arg_text(node, 0).strip(), mode="eval").body)
                except SyntaxError:
                    return None
            # a call of a class: its instance reaches the class's methods
            return func
        return None

    def subscript(self, node):
        """sys.modules["m"], globals()["x"], vars(m)["x"], m.__dict__["x"] with a spelled-out key."""
        key = self.text(node.slice)
        if key is None:
            return None
        value = node.value
        if self.dotted(value) == "sys.modules":
            return key
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if value.func.id in ("globals", "locals") and not value.args:
                return self.alias.get(key)
            if value.func.id == "vars" and len(value.args) == 1:
                base = self.dotted(value.args[0])
                return f"{base}.{key}" if base else None
        if isinstance(value, ast.Attribute) and value.attr == "__dict__":
            base = self.dotted(value.value)
            return f"{base}.{key}" if base else None
        return None

    def collect_aliases(self):
        for _ in range(3):               # a fixpoint for chains of assignments (m = masks; n = m)
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        self.alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                            a.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom):
                    module = self.absolute(node.module, node.level)
                    for a in node.names:
                        if a.name != "*":
                            self.alias[a.asname or a.name] = f"{module}.{a.name}"
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    target = node.targets[0].id
                    if self.dotted(node.value):
                        self.alias[target] = self.dotted(node.value)
                    elif self.text(node.value) is not None:
                        self.consts[target] = self.text(node.value)

    def walk(self):
        self.collect_aliases()
        for node in ast.walk(self.tree):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Import):
                self.names += [(line, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = self.absolute(node.module, node.level)
                self.names += [(line, module if a.name == "*" else f"{module}.{a.name}") for a in node.names]
                if any(a.name == "*" for a in node.names):
                    self.names.append((line, f"{module}.*"))
            elif isinstance(node, (ast.Attribute, ast.Name, ast.Call, ast.Subscript)):
                name = self.dotted(node)
                if name:
                    self.names.append((line, name))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("exec", "compile") and self.arg_text(node, 0) is not None:
                self.inner.append((line, self.arg_text(node, 0)))

    def strings(self):
        """(line, text) of every spelled-out string but the docstrings."""
        docs = {id(n.value) for n in ast.walk(self.tree) if isinstance(n, ast.Expr)}
        return [(n.lineno, t) for n in ast.walk(self.tree) if isinstance(n, ast.expr) and id(n) not in docs
                and isinstance(n, (ast.Constant, ast.BinOp, ast.JoinedStr)) and (t := self.text(n))]


def _path_hits(text, folder, files):
    """The answer file or folder a string names as a path (relative to the repository or the file), or None."""
    if "/" not in text and "\\" not in text and not text.endswith(".py"):
        return None
    for base in (ROOT, folder, Path.cwd()):
        try:
            path = (base / text.replace("\\", "/")).resolve()
        except (OSError, ValueError):
            continue
        hit = next((f for f in files if path == f or f in path.parents), None)
        if hit is not None:
            return hit
    return None


def check_source(source, exercise, package="exercises", folder=None, _seen=(), _alias=None, _consts=None):
    """Findings for one file's source: what it reaches of the answer, with the line; [] when it reaches nothing.

    folder: where the student's other files are; a file that imports another of them (exercise 5 reusing the
    student's exercise 2) is checked through it, against THIS exercise's answers."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []                        # nothing to prove: the grader's import reports the error
    walker = _Walker(tree, package, _alias, _consts)
    walker.walk()
    forbidden, allowed = answers(exercise), ALLOWED.get(exercise, ())
    best = {}                            # line -> (resolvable, length, finding): one finding a line, the fullest
    for line, name in walker.names:
        if name.endswith(".*"):          # a star import: every name of the module, answers included
            home = _resolve(name[:-2])[0]
            hit = next((f for f in forbidden if f.startswith(home + ".") and not _inside(f, allowed)), None)
            what, home, obj = f"from {name[:-2]} import * (it imports {hit})", hit, True
        else:
            # where it is defined (the graders and the fixtures are not imported to find out: they are named)
            home, obj = (name, None) if _inside(name, FIXTURES + graders()) else _resolve(name)
            hit = next((_inside(n, forbidden) for n in (name, home)
                        if _inside(n, forbidden) and not _inside(n, allowed)), None)
            what = name if home == name or _inside(name, KEY + FIXTURES) or _inside(name, graders()) else \
                f"{name} (that is {home})"
        if hit:
            rank = (obj is not None, len(name), Finding(line, what, kind_of(hit)))
            best[line] = max(best.get(line, rank), rank)
    found = {rank[2] for rank in best.values()}
    files = answer_files(exercise)
    for line, text in walker.strings():
        hit = _path_hits(text, Path(folder or ROOT), files)
        if hit is not None:
            where = hit.relative_to(ROOT) if ROOT in hit.parents else hit
            found.add(Finding(line, f"{text!r} (a path)", (
                kind_of("exercises.solutions") if hit == KEY_PATH else
                kind_of("tests.class_fixtures") if hit == FIXTURES_PATH else
                kind_of(f"exercises.{hit.stem}") if hit.name.startswith("test_") else
                f"the file of the project's implementation of this exercise ({where})")))
    for line, text in walker.inner:      # exec / compile of a spelled-out string: its code, at this line
        for f in check_source(text, exercise, package, folder, _seen, walker.alias, walker.consts):
            found.add(Finding(line, f"{f.what} (in the code exec runs)", f.why))
    for line, name in walker.names:      # the student's own files it imports, checked in turn
        parts = name.split(".")
        other = Path(folder or ".") / f"{parts[1]}.py" if parts[0] == package and len(parts) > 1 else None
        if other is not None and other.is_file() and parts[1] not in _seen and \
                not parts[1].startswith(("_", "test_")):
            inner = check_source(other.read_text(errors="replace"), exercise, package, folder, (*_seen, parts[1]))
            if inner:
                found.add(Finding(line, f"{name} (your {other.name}'s line {inner[0].line}: {inner[0].what})",
                                  inner[0].why))
    return sorted(found)


def check_file(path, exercise):
    path = Path(path)
    return check_source(path.read_text(encoding="utf-8", errors="replace"), exercise, folder=path.parent,
                        _seen=(path.stem,))


def verdict(findings):
    """'' for a file that reaches nothing of the answer, else 'copied'."""
    return "copied" if findings else ""


def message(findings, exercise, limit=3):
    """The finding, in words: what the file reaches, on which line, and what the student can do."""
    lines = [f"{exercise}.py is graded on your own code, but its {findings[0]}"]
    lines += [f"  and {f}" for f in findings[1:limit]]
    lines.append("  (every test of the exercise fails until the file computes the answer itself: torch, the "
                 "standard library and what the stub imports are yours to use)")
    return "\n".join(lines)

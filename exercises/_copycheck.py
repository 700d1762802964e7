"""The copy check: is a student's file its own work, or does it reach the exercise's answer?

It reads the file's source (it never runs it) and decides from what the code IMPORTS and CALLS, never from the
names it chooses: a variable `rouge` or `left_to_right` is the student's business. An AST walk resolves every
import (absolute, relative, aliased, inside a function), every attribute chain on an imported name
(`masks.seq2seq`, `objectives.unilm.masks.seq2seq`), every `getattr(x, "constant")`, `import_module("constant")`
and `__import__("constant")`, and every simple assignment of one of these (`m = masks; m.seq2seq(...)`), to a
dotted name. A name of the project is then resolved to its object (importing project modules only, never one the
student names outside the project), so a re-export (`objectives.unilm.masks`) is the module it re-exports.

    copied          the dotted name is, or lies inside, one of ANSWERS[exercise] or EVERYWHERE; or a function of
                    the file is an answer function (the project's or the key's, of at least MIN_STATEMENTS
                    statements) with only its names changed: pasted code, renamed
    cannot check    a dynamic trick the walk cannot follow: exec/eval/compile, a computed import or getattr,
                    globals()/vars()/sys.modules/__dict__, importlib's machinery, a subprocess... It is flagged
                    because the check cannot vouch for the file, with the line and a way to write it plainly.

What it cannot see: code pasted from the answer key or the project and then restructured (statements reordered,
a loop rewritten: a correct answer looks like the key anyway), work copied from a classmate, and a route to the
answer through an object the AST cannot name (an attribute of an instance of a project class that is not itself
the answer, e.g. the head of a model a function returns). The check is a guard against shortcuts, not a
plagiarism detector.
"""
import ast
import copy
import functools
import importlib
import inspect
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

# What counts as "the answer", per exercise. An entry is a dotted name; "module.*" means every function and
# class DEFINED in that module (its constants, e.g. the token kinds CTX, ORIG, ..., stay free to use). Using
# torch is always fine; project pieces that are not the exercise's answer are fine too, and named in ALLOWED.
ANSWERS = {
    # WordPiece's greedy encoding: the class does it (._wordpiece, .encode, .tokenize); so do HF's tokenizers
    "ex01_wordpiece": ("tokenizer.WordPiece", "tokenizers", "transformers"),
    # UniLM's masks, the pseudo-masked mask, the span flow: every mask function of objectives/masks.py, and
    # the two other routes to the rule: a Batch's attn_mask, and the fast layer's twins (fast.slot_mask, ...)
    "ex02_unilm_mask": ("objectives.masks.*", "objectives.Batch", "fast"),
    "ex03_blockwise": ("objectives.pmlm.*",),
    "ex04_pseudo_mask": ("objectives.masks.*", "objectives.Batch", "fast"),
    "ex05_span_flow": ("objectives.masks.*", "objectives.ernie_gen.*", "objectives.Batch", "fast"),
    # PALM's mixture: the head itself, also as a Transformer's copy_head (M.Transformer(cfg).copy_head.mix)
    "ex06_pointer": ("model.PointerGenerator", "model.Transformer.copy_head"),
    # the beam step: beam_search, ban_tokens, gnmt_penalty and the rest of generate.py, and the fast layer's
    # twins of its pieces (fast.beam.choose, fast.beam.static_ban)
    "ex07_beam_step": ("generate.*", "fast"),
    # ROUGE-L: evaluate.py's LCS and scores, and every third-party scorer
    "ex08_rouge_l": ("evaluate.*",),
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
# The answer key and the reference scorers: never, in any exercise
EVERYWHERE = ("exercises.solutions", "exercises.reference", "rouge_score", "nltk", "sacrebleu")

# Calls whose target the walk cannot follow when their argument is computed, or ever
DYNAMIC_CALLS = {"exec", "eval", "compile", "globals", "locals", "vars", "breakpoint"}
DYNAMIC_NAMES = ("importlib", "runpy", "pkgutil", "sys.modules", "builtins", "marshal", "pickle", "ctypes",
                 "subprocess", "os.system", "os.popen", "os.exec", "os.spawn", "multiprocessing",
                 "types.FunctionType", "types.CodeType", "operator.attrgetter", "operator.methodcaller")
DYNAMIC_ATTRS = {"__dict__", "__globals__", "__builtins__", "__code__", "__getattribute__", "__subclasses__",
                 "__loader__", "__spec__"}
PLAIN = "write the import and the call out plainly (the grader must be able to read what your code reaches)"


class Finding(NamedTuple):
    kind: str           # "copied" or "cannot check"
    line: int
    what: str           # the dotted name or the construct
    why: str

    def __str__(self):
        return f"line {self.line}: {self.what}: {self.why}"


def _project_modules():
    """Top-level names of the project's own modules and packages (the only ones the check imports)."""
    names = {p.stem for p in ROOT.glob("*.py")}
    return names | {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}


def _resolve(dotted):
    """A dotted name of the project -> (canonical dotted name, object), or (dotted, None) if not resolvable."""
    parts = dotted.split(".")
    if parts[0] not in _project_modules() | set(sys.modules):
        return dotted, None
    obj, used = None, 0
    for k in range(len(parts), 0, -1):                  # the longest importable prefix, then attributes
        try:
            obj, used = importlib.import_module(".".join(parts[:k])), k
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


def answers(exercise):
    """The exercise's forbidden dotted names, "module.*" expanded to the functions and classes it defines."""
    out = list(EVERYWHERE)
    for entry in ANSWERS.get(exercise, ()):
        if not entry.endswith(".*"):
            out.append(entry)
            continue
        module = importlib.import_module(entry[:-2])
        out += [f"{module.__name__}.{k}" for k, v in vars(module).items()
                if callable(v) and getattr(v, "__module__", None) == module.__name__]
    return out


def _inside(dotted, names):
    """The entry of `names` that `dotted` is, or lies inside (an attribute, a submodule), else None."""
    return next((n for n in names if dotted == n or dotted.startswith(n + ".")), None)


class _Walker:
    """One pass over a file: the dotted name of every import, attribute chain and alias."""

    def __init__(self, tree, package):
        self.tree, self.package, self.alias = tree, package, {}
        self.names = []                  # (line, dotted name) reached by the code
        self.dynamic = []                # (line, construct, why)

    def absolute(self, module, level):
        """A relative import's module, from the package the student's file sits in (exercises)."""
        if not level:
            return module
        base = self.package.split(".")[:len(self.package.split(".")) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def dotted(self, node):
        """The dotted name an expression stands for, or None."""
        if isinstance(node, ast.Name):
            return self.alias.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name == "getattr" and _constant(node, 1):
                base = self.dotted(node.args[0])
                return f"{base}.{node.args[1].value}" if base else None
            if self.dotted(node.func) == "importlib.import_module" and _constant(node, 0):
                return node.args[0].value
            if name == "__import__" and _constant(node, 0):
                # __import__("a.b") is the package a; with a fromlist it is the module a.b
                fromlist = len(node.args) > 3 or any(k.arg == "fromlist" for k in node.keywords)
                return node.args[0].value if fromlist else node.args[0].value.split(".")[0]
            # a call of a class: its instance reaches the class's methods
            return self.dotted(node.func)
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
                        isinstance(node.targets[0], ast.Name) and self.dotted(node.value):
                    self.alias[node.targets[0].id] = self.dotted(node.value)

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
            elif isinstance(node, (ast.Attribute, ast.Name, ast.Call)):
                name = self.dotted(node)
                if name:
                    self.names.append((line, name))
                self.check_dynamic(node, line)

    def check_dynamic(self, node, line):
        if isinstance(node, ast.Attribute) and node.attr in DYNAMIC_ATTRS:
            self.dynamic.append((line, node.attr, "reaches objects by a name the grader cannot read"))
        if isinstance(node, ast.Name) and node.id == "__builtins__":
            self.dynamic.append((line, node.id, "reaches functions by a name the grader cannot read"))
        if isinstance(node, ast.Attribute) and _inside(self.dotted(node) or "", ("sys.modules", "builtins")):
            self.dynamic.append((line, self.dotted(node), "reaches modules by a name the grader cannot read"))
        if not isinstance(node, ast.Call):
            return
        name = node.func.id if isinstance(node.func, ast.Name) else None
        func = self.dotted(node.func) or ""
        if name in DYNAMIC_CALLS:
            self.dynamic.append((line, f"{name}()", "runs or looks up code the grader cannot read"))
        elif name in ("getattr", "setattr", "delattr") and not _constant(node, 1) or \
                name == "__import__" and not _constant(node, 0):
            self.dynamic.append((line, f"{name}() with a computed name", "the grader cannot tell what it reaches"))
        elif func == "importlib.import_module" and _constant(node, 0):
            pass                         # a constant module name is followed like an import
        elif any(func == n or func.startswith(n + ".") or func.startswith(n) and n.endswith(("exec", "spawn"))
                 for n in DYNAMIC_NAMES):
            self.dynamic.append((line, f"{func}()", "loads or runs code the grader cannot read"))


def _constant(call, k):
    """Whether argument k of a call is a constant string."""
    return len(call.args) > k and isinstance(call.args[k], ast.Constant) and isinstance(call.args[k].value, str)

# --- pasted code: a function of the answer with the names changed ------------------------------------------------

MIN_STATEMENTS = 4                       # shorter functions may match by chance (a one-line penalty, a guard)


class _Shape(ast.NodeTransformer):
    """Every name a function binds or reads becomes its order of first appearance (v0, v1, ...); attributes,
    constants and the structure stay. Two functions with the same shape differ only in their names."""

    def __init__(self):
        self.names = {}

    def rename(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        node.id = self.rename(node.id)
        return node

    def visit_arg(self, node):
        node.arg, node.annotation = self.rename(node.arg), None
        return node

    def visit_FunctionDef(self, node):
        node.name, node.returns, node.decorator_list = "f", None, []
        body = node.body
        # a docstring is text, not code
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node


def _shape(node):
    """A FunctionDef's shape (a string), or None for a function too short to tell copied from written."""
    if sum(isinstance(n, ast.stmt) for n in ast.walk(node)) - 1 < MIN_STATEMENTS:
        return None
    return ast.dump(_Shape().visit(copy.deepcopy(node)), annotate_fields=False)


def _functions(obj, seen):
    """The project functions an answer object holds: a function, a class's methods, a module's own ones."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if inspect.isfunction(obj):
        return [obj]
    if isinstance(obj, staticmethod):
        return _functions(obj.__func__, seen)
    if inspect.isclass(obj):
        return [f for v in vars(obj).values() for f in _functions(v, seen)]
    if inspect.ismodule(obj) and obj.__name__.split(".")[0] in _project_modules():
        return [f for v in vars(obj).values()
                if getattr(v, "__module__", None) == obj.__name__ for f in _functions(v, seen)]
    return []


@functools.lru_cache(maxsize=None)
def _answer_shapes(exercise):
    """shape -> the dotted name of the answer function it came from (the answer key's own functions too)."""
    shapes, seen = {}, set()
    for name in answers(exercise):
        obj = _resolve(name)[1]
        for fn in _functions(obj, seen) if obj is not None else []:
            try:
                tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            except (OSError, TypeError, SyntaxError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (shape := _shape(node)):
                    shapes.setdefault(shape, f"{fn.__module__}.{fn.__qualname__}")
    return shapes


def _pasted(tree, exercise):
    """Findings for the functions of a student's file that are an answer function with the names changed."""
    shapes = _answer_shapes(exercise)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                (home := shapes.get(_shape(node))):
            kind = "the answer key" if _inside(home, EVERYWHERE[:2]) else "the project's answer to this exercise"
            found.append(Finding("copied", node.lineno, f"def {node.name}",
                                 f"is {home}'s code with the names changed, {kind}"))
    return found


def check_source(source, exercise, package="exercises", folder=None, _seen=()):
    """Findings for one file's source (copied / cannot check); [] means the work may be the student's own.

    folder: where the student's other files are; a file that imports another of them (exercise 5 reusing the
    student's exercise 2) is checked through it, against THIS exercise's answers."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []                        # nothing to accuse: the grader's import reports the error
    walker = _Walker(tree, package)
    walker.walk()
    forbidden, allowed = answers(exercise), ALLOWED.get(exercise, ())
    found, seen = [], set()
    for line, name in walker.names:
        if name.endswith(".*"):          # a star import: every name of the module, answers included
            home = _resolve(name[:-2])[0]
            hit = next((f for f in forbidden if f.startswith(home + ".") and not _inside(f, allowed)), None)
            why = f"imports every name of {name[:-2]}, among them {hit}" if hit else None
        else:
            reached = (name, _resolve(name)[0])          # as written, and where it is defined
            hit = next((_inside(n, forbidden) for n in reached
                        if _inside(n, forbidden) and not _inside(n, allowed)), None)
            why = f"reaches {hit}" if hit else None
        if why and (line, hit) not in seen:
            seen.add((line, hit))
            kind = "the answer key" if _inside(hit, EVERYWHERE[:2]) else \
                "a reference scorer" if _inside(hit, EVERYWHERE) else "the project's answer to this exercise"
            found.append(Finding("copied", line, name, f"{why}, {kind}"))
    found += [Finding("cannot check", line, what, f"{why}; {PLAIN}") for line, what, why in walker.dynamic]
    found += _pasted(tree, exercise)
    for line, name in walker.names:                  # the student's own files it imports, checked in turn
        parts = name.split(".")
        other = Path(folder or ".") / f"{parts[1]}.py" if parts[0] == package and len(parts) > 1 else None
        if other is not None and other.is_file() and parts[1] not in _seen and not parts[1].startswith(("_", "test_")):
            for f in check_source(other.read_text(errors="replace"), exercise, package, folder,
                                  (*_seen, parts[1])):
                found.append(f._replace(line=line, what=name, why=f"through {other.name} line {f.line}: {f.why}"))
    return sorted(set(found), key=lambda f: (f.line, f.kind, f.what))


def check_file(path, exercise):
    path = Path(path)
    return check_source(path.read_text(encoding="utf-8", errors="replace"), exercise, folder=path.parent,
                        _seen=(path.stem,))


def verdict(findings):
    """'' for an honest file, else 'copied' or 'cannot check' (copied wins)."""
    kinds = {f.kind for f in findings}
    return "copied" if "copied" in kinds else "cannot check" if kinds else ""


def message(findings, exercise, limit=3):
    """The accusation, in words: what was found, where, and what the student can do."""
    v = verdict(findings)
    what = "reaches the answer" if v == "copied" else "uses code the grader cannot check"
    lines = [f"{exercise} is graded on your own code, but your file {what}: {findings[0]}"]
    lines += [f"  and {f}" for f in findings[1:limit]]
    lines.append("  (the check reads what your file imports and calls, never your names; every test of the "
                 "exercise fails until the file is plainly your own work)")
    return "\n".join(lines)

"""What the graders share: the reference switch, a tiny model, and failure messages that teach.

The switch. A grader grades `exNN_*.py` beside it (in exercises/: the student's file). With the environment variable
UNIGEN_REFERENCE=1 it grades the answer key instead (exercises/solutions/: the project's own code behind the
same names), and says so loudly: every grader must pass that way, and fail on the untouched stub
(exercises/verify.py checks both). The copy check (exercises/_copycheck.py) runs on the student's file before
it is imported: a file that reaches the exercise's answer fails every test of the exercise.

Graders only READ the student's file; nothing here writes into exercises/.
"""
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

import torch

import model as M
from objectives import Batch, pad
from exercises import _copycheck
from objectives.masks import CTX, ORIG, PAD, PSEUDO, SPAN

HERE = Path(__file__).resolve().parent

REFERENCE = os.environ.get("UNIGEN_REFERENCE", "") not in ("", "0")
GRADED_THE_SOLUTIONS = "graded: the solutions, not your files (UNIGEN_REFERENCE=1)"

# Tiny tensors: one intra-op thread is faster than two on a busy 2-core machine
torch.set_num_threads(1)


class Refused:
    """Stands in for a student's module that reaches the answer (or does not import): every name of it fails
    its test with the same message, so that no test of the exercise passes on copied work."""

    def __init__(self, name, why, findings=()):
        self._name, self._why, self.findings = name, why, list(findings)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AssertionError(self._why)


def load(name):
    """The module under grading: <name>.py in the folder of the grader that calls this (exercises/, or a copy of
    a grader next to a student's file), or with UNIGEN_REFERENCE=1 the answer key (exercises/solutions/). A file
    that reaches the answer is served as Refused: every test then fails with the copy check's message."""
    if REFERENCE:
        # pytest's output says it too (exercises/conftest.py); this line is for a grader imported without it
        print(f"\n*** {GRADED_THE_SOLUTIONS} ***", file=sys.stderr)
        from exercises import solutions
        return getattr(solutions, name)
    folder = Path(sys._getframe(1).f_globals.get("__file__", __file__)).resolve().parent
    path = folder / f"{name}.py"
    findings = _copycheck.check_file(path, name) if path.exists() else []
    if findings:
        return Refused(name, _copycheck.message(findings, name), findings)
    try:
        if folder == HERE:
            return importlib.import_module(f"exercises.{name}")
        # a file beside a copy of the grader: a module of its own, so that several can be graded in one process
        spec = importlib.util.spec_from_file_location(f"exercises._graded_{abs(hash(str(folder)))}_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    except Exception as e:                       # a file that does not import fails every test, one line
        line = traceback.format_exception_only(type(e), e)[-1].strip()
        return Refused(name, f"{name}.py does not import: {line}")


def written_by_you(module):
    """The copy check, as a test: the student's file must not reach the exercise's answer (exercises/_copycheck.py
    reads what it imports and calls, never its names). Under the switch, check that the switch really graded
    the answer key."""
    if REFERENCE:
        assert not isinstance(module, Refused) and "exercises.ex" not in repr(module), \
            f"UNIGEN_REFERENCE=1 graded a stub: {module!r}"
        return
    if isinstance(module, Refused):
        raise AssertionError(module._why)


# --- a tiny model for the leakage checker -------------------------------------------------------------------------

def tiny_model(vocab_size, n_layer=2, seed=0, **overrides):
    """A small random model in eval mode (dropout off: a forbidden gradient must be exactly 0.0, not noise)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab_size, n_layer=n_layer, n_head=2, n_embd=32, ffn_dim=64, max_position=128,
               dropout=0.0)
    cfg.update(overrides)
    return M.Transformer(M.ModelConfig(**cfg)).eval()


def batch_of(rows):
    """Per-example dicts of lists (input_ids, position_ids, segment_ids, labels, kind, step) -> Batch."""
    col = lambda k, v: pad([r[k] for r in rows], v)
    return Batch(col("input_ids", 0), col("position_ids", 0), col("segment_ids", 0), col("labels", -100),
                 col("kind", PAD), col("step", 0))


# --- words for tokens, cells and leaks ----------------------------------------------------------------------------

def describe(kind, step, names=None):
    """-> describe(i): the token at position i in words, from its kind and step (one example's (L,) tensors).

    names: optional {kind: format} to use a paper's words, e.g. {SPAN: "span [ATTN] of the span starting at
    target {b}"}.
    """
    words = {CTX: "context", ORIG: "original of step {b}", PSEUDO: "[P] of step {b}",
             SPAN: "span-flow [ATTN] of step {b}", PAD: "padding"}
    words.update(names or {})

    def say(i):
        return words[int(kind[i])].format(b=int(step[i]))
    return say


def first_differences(got, want, limit=3):
    """The first `limit` cells (i, j) where two (L, L) masks differ, row by row."""
    return [tuple(c) for c in (got != want).nonzero().tolist()[:limit]]


def mask_diff_message(got, want, say, why=None, title="your mask", limit=3):
    """Words for the first cells where `got` differs from `want` (the project's): row i = query, key j."""
    cells = first_differences(got, want, limit)
    n = int((got != want).sum())
    lines = [f"{title} differs from the project's in {n} cell(s); the first:"]
    for i, j in cells:
        may = "may" if got[i, j] else "may NOT"
        should = "may not" if got[i, j] else "may"
        line = f"  row {i} ({say(i)}) {may} attend key {j} ({say(j)}), but it {should}"
        reason = why(i, j, bool(got[i, j])) if why else None
        lines.append(line + (f": {reason}" if reason else ""))
    return "\n".join(lines)


def leak_message(report, say, model, limit=3):
    """Words for the leakage checker's report: which prediction depends on which forbidden input, and why."""
    if not report.leaks:
        return str(report)
    lines = [f"the leakage checker (objectives/leakage.py) ran a {model.config.n_layer}-layer model with your "
             f"mask: {len(report.leaks)} prediction(s) depend on an input they must not see; the first:"]
    for leak in report.leaks[:limit]:
        lines.append(f"  the prediction at row {leak.row} ({say(leak.row)}) has gradient {leak.gradient:.2g} "
                     f"from input {leak.input} ({say(leak.input)})")
    lines.append("  (a gradient is exactly 0.0 unless some path of attention, through any number of layers, "
                 "carries the input to the prediction: the model could read the answer it is asked for)")
    return "\n".join(lines)


def picture(mask, n=None):
    """An (L, L) bool mask as rows of 1/0, for a failure message."""
    n = n or mask.size(0)
    return "\n".join("    " + " ".join("1" if v else "." for v in row[:n].tolist()) for row in mask[:n])

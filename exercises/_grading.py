"""What the graders share: the reference switch, a tiny model, and failure messages that teach.

The switch. A grader grades `exercises/exNN_*.py`, the student's file. With the environment variable
UNIGEN_REFERENCE=1 it grades the project's own code behind the same names instead (exercises/reference.py):
every grader must pass that way, and fail on the untouched stub (exercises/verify.py checks both).

Graders only READ the student's file; nothing here writes into exercises/.
"""
import ast
import importlib
import inspect
import os

import torch

import model as M
from objectives import Batch, pad
from objectives.masks import CTX, ORIG, PAD, PSEUDO, SPAN

REFERENCE = os.environ.get("UNIGEN_REFERENCE", "") not in ("", "0")

# Tiny tensors: one intra-op thread is faster than two on a busy 2-core machine
torch.set_num_threads(1)


def load(name):
    """The module under grading: exercises/<name>.py, or with UNIGEN_REFERENCE=1 the project's own code."""
    if REFERENCE:
        from exercises import reference
        return getattr(reference, name)
    return importlib.import_module(f"exercises.{name}")


def must_not_use(fn, names, why):
    """Fail if the student's function's source mentions one of `names` (the project's answer to the exercise).

    Under the switch the function IS the project's code: then check that the switch really graded it.
    """
    if REFERENCE:
        where = inspect.getmodule(fn).__name__
        assert not where.startswith("exercises.ex"), f"UNIGEN_REFERENCE=1 graded the stub {where}"
        return
    tree = ast.parse(inspect.getsource(inspect.getmodule(fn)))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {part for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names for part in a.name.split(".")}
    hit = sorted(used & set(names))
    assert not hit, f"your file uses {hit}: {why}"


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

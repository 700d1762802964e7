"""fast/beam.py's whole-step search (WholeStep: the model step and the search's bookkeeping in one step function, which
CUDA replays as one graph, StepGraph) equals the readable search (generate.beam_search, generate.greedy), run as its
eager twin on a CPU: the same hypotheses in the same order, scores within 1e-5, for all four objectives, beams 1 to 5,
[EOS] banned before min_len, n-gram blocking on and off, two length penalties, sources of different lengths that end
early or reach max_len. Its static n-gram ban equals generate.ban_tokens at every step. And what a CUDA graph needs,
checked on a CPU: from the second step on every step runs the same ops on the same shapes, reading the same tensors
(the same addresses) and no Python number that changes. The capture itself runs only on a GPU (bench/check_cuda.py).
"""
import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import fast
import fast.beam as FB
import generate as G
from fast import StaticDecoder
from tests.test_fast import assert_same_hypotheses
from tests.test_fast_beam import EagerStepGraph, finishing, readable_reference, search
# one_thread: test_generate's autouse fixture (tiny tensors run faster on one intra-op thread)
from tests.test_generate import EOS, NAMES, TOK, one_thread  # noqa: F401

# (beam, min_len, no_repeat_ngram, length_penalty, max_len); beam 1 is greedy search. Every setting but the one of
# no_repeat_ngram 2 has sources that reach max_len and sources that end before, for every objective (with bigram
# blocking unilm's all end early); no_repeat_ngram 2 and 11 > max_len - 1 (never applies) are the edges of the
# static ban's window
SETTINGS = [(2, 2, 3, 0.6, 10), (3, 1, 0, 1.0, 10), (4, 2, 2, 0.6, 8), (5, 2, 3, 1.0, 8), (5, 0, 0, 0.6, 10),
            (3, 1, 11, 1.0, 10), (1, 2, 3, 0.6, 10), (1, 0, 0, 1.0, 10)]


@pytest.mark.parametrize("ignore", [True, False], ids=["ignore-dot", "no-ignore"])
@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_static_ban_equals_ban_tokens(n, ignore):
    """At every step t of a 9-token history (few distinct tokens, so that n-grams repeat, with the ignore word among
    them): static_ban on the whole buffer and the device step t forbids exactly what ban_tokens forbids on the first t
    columns, min_len 4."""
    g = torch.Generator().manual_seed(n)
    dot = TOK.token_to_id(".")
    words = torch.tensor([dot, EOS, 20, 21, 22])
    hist = words[torch.randint(0, len(words), (6, 9), generator=g)]
    rules = G.decoding_rules(TOK, 4, n, None if ignore else [], "cpu")
    assert (rules["ignore"] is not None) == ignore
    banned_some = 0
    for t in range(hist.size(1)):
        logp = torch.randn(6, len(TOK), generator=g).log_softmax(-1)
        want = G.ban_tokens(logp.clone(), hist[:, :t], t, **rules)
        got = FB.static_ban(logp.clone(), hist, torch.tensor(t), **rules)
        assert torch.equal(got, want)
        banned_some += int((want[:, 20:23] == float("-inf")).sum())
    assert (banned_some > 0) == (n > 0)                       # the n-gram rule did forbid words


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "beam{}-min{}-ngram{}-lp{}-max{}".format(*s))
@pytest.mark.parametrize("name", NAMES)
def test_whole_step_search_equals_readable_search(name, setting, monkeypatch):
    """The whole-step search (fast.beam_search / fast.greedy on fast.StaticDecoder, run as its eager twin) gives
    generate's hypotheses, order and scores, and so does the per-kernel loop on the same static step (WHOLE_STEP off);
    some sources reach max_len, some end before."""
    K, min_len, ngram, alpha, max_len = setting
    model, obj, srcs, rules, rows, want = readable_reference(name, setting)
    if ngram != 2:                                             # some sources reach max_len, some end before
        assert len(rows) == max_len and rows[-1] < rows[0]
    assert rows[-1] < rows[0]
    runs = []
    run = FB.WholeStep.run
    monkeypatch.setattr(FB.WholeStep, "run", lambda self, *a: runs.append(self) or run(self, *a))
    for whole in (True, False):
        monkeypatch.setattr(FB, "WHOLE_STEP", whole)
        got = search(fast, StaticDecoder(model, obj, srcs, max_len), K, max_len, alpha, rules)
        assert_same_hypotheses(got, want)
        assert [len(h) for h in got] == [len(h) for h in want]
        assert all(len(ids) >= min_len for h in got for ids, _ in h)
    assert len(runs) == 1                                      # the whole-step search ran once, the loop once
    # beam search ran on one cache row a source, the K beams' target slots side by side (StaticCache.group_beams)
    cache = runs[0].dec.cache
    assert cache.beams == (K if K > 1 else 1)
    assert cache.k[0].size(0) == len(srcs) and cache.capacity == cache.n_src + cache.beams * cache.T


class StepLog(TorchDispatchMode):
    """Every op a step runs: its name, the shapes and the Python values of its arguments, and the storage addresses
    of the tensors it reads that the step did not make itself (what a CUDA graph holds on to)."""

    def __init__(self):
        super().__init__()
        self.ops = None

    def start(self):
        self.ops, self.made = [], set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.ops is not None:
            leaves = pytree.tree_leaves((args, kwargs))
            tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
            outside = tuple(p for p in (x.untyped_storage().data_ptr() for x in tensors) if p not in self.made)
            shapes = tuple(tuple(x.shape) for x in tensors)
            values = tuple(repr(x) for x in leaves if not isinstance(x, torch.Tensor))
            self.ops.append((str(func), shapes, values, outside))
            self.made.update(x.untyped_storage().data_ptr() for x in pytree.tree_leaves(out)
                             if isinstance(x, torch.Tensor))
        return out


@pytest.mark.parametrize("K", [1, 4])
@pytest.mark.parametrize("name", NAMES)
def test_every_step_runs_the_same_ops_on_the_same_tensors(name, K, monkeypatch):
    """What makes the step capturable as one CUDA graph, checked where no graph runs: the step function StepGraph gets
    (min_len = max_len: every step runs) calls the same ops with the same shapes and Python arguments at every step,
    and reads the same tensors from outside (same storage addresses: nothing is reallocated between replays); the
    hypotheses are the readable search's."""
    model, obj, srcs = finishing(name)
    rules = G.decoding_rules(TOK, 10, 3, None, "cpu")
    want = search(G, G.Decoder(model, obj, srcs, 10), K, 10, 1.0, rules)
    log = StepLog()
    steps = []

    class LoggedGraph(EagerStepGraph):
        def __call__(self):
            log.start()
            super().__call__()
            steps.append(log.ops)
            log.ops = None
    monkeypatch.setattr(FB, "StepGraph", LoggedGraph)
    monkeypatch.setattr(FB, "WHOLE_STEP", True)
    dec = StaticDecoder(model, obj, srcs, 10)
    dec.graphed = True                                         # what generate.py's door asks for on CUDA
    with log:
        got = search(fast, dec, K, 10, 1.0, rules)
    assert_same_hypotheses(got, want)
    assert len(steps) == 9 and len(steps[0]) > 50              # steps 1..9 through the graph
    assert all(ops == steps[0] for ops in steps[1:])
    # the step reads the cache's buffers, the history and the records in place
    outside = {p for op in steps[0] for p in op[3]}
    assert {b.untyped_storage().data_ptr() for b in dec.cache.k + dec.cache.v} <= outside

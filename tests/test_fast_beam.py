"""The fast layer's search (fast/beam.py: fast.beam_search, fast.greedy) equals the readable one (generate.beam_search,
generate.greedy): the same hypotheses in the same order and the same scores, for all four objectives, on the readable
KV cache, on fast.StaticDecoder run eagerly (the whole-step search, what CUDA replays as one graph) and without a
cache, with sources that end early, sources that reach max_len, [EOS] banned before min_len, n-gram blocking on and
off, two length penalties and beams of 2 to 5; on hand-built score tables full of exact ties and impossible (-inf)
candidates; and on generate.py's CUDA path simulated on a CPU. A counter of host reads checks that the step
loop reads nothing from the tensors but the "is every source done?" flag every few steps."""
import functools
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fast
import fast.beam as FB
import generate as G
from objectives import get_objective
from fast import StaticDecoder
from tests.test_fast import EOS_BIAS, EagerGraph, assert_same_hypotheses
# one_thread: test_generate's autouse fixture (tiny tensors run faster on one intra-op thread)
from tests.test_generate import (A, B_, C, D, EOS, NAMES, TOK, TableDecoder, make_model, one_thread,  # noqa: F401
                                 sources)

# (beam, min_len, no_repeat_ngram, length_penalty, max_len); beam 1 is greedy search
SETTINGS = [(2, 2, 3, 1.0, 10), (3, 1, 0, 0.6, 10), (4, 3, 3, 0.6, 12), (5, 2, 0, 1.0, 8), (5, 0, 3, 1.0, 10),
            (1, 2, 3, 1.0, 10)]


def finishing(name, eos_bias=None):
    """A tiny random model whose sources (six, of different lengths) end at different steps."""
    model, obj = make_model(name), get_objective(name, TOK, task="seq2seq", max_len=64)
    with torch.no_grad():
        model.lm_bias[EOS] += EOS_BIAS[name] if eos_bias is None else eos_bias
    return model, obj, sources((0, 3, 9, 14, 5, 11), seed=4)


def search(module, dec, K, max_len, alpha, rules):
    """module's beam search (greedy for K = 1): generate's readable one or the fast layer's."""
    if K == 1:
        return module.greedy(dec, max_len, alpha, rules)
    return module.beam_search(dec, K, max_len, alpha, rules)


def counting_steps(dec):
    """Wrap the model's step: -> the list that gets the number of rows of every step. On fast.StaticDecoder that is its
    step (the whole-step search never calls dec.logprobs), else dec.logprobs."""
    rows = []
    if isinstance(dec, StaticDecoder):
        step = dec.step
        dec.step = lambda x, *a: rows.append(len(x)) or step(x, *a)
        return rows
    logprobs = dec.logprobs
    dec.logprobs = lambda: rows.append(len(dec.tgt)) or logprobs()
    return rows


def readable_reference(name, setting):
    """generate's own search on the readable cache for a setting (K, min_len, ngram, alpha, max_len) -> the model,
    objective, sources and rules it ran with, the rows of each of its steps, and its hypotheses."""
    K, min_len, ngram, alpha, max_len = setting
    model, obj, srcs = finishing(name)
    rules = G.decoding_rules(TOK, min_len, ngram, None, "cpu")
    dec = G.Decoder(model, obj, srcs, max_len)
    rows = counting_steps(dec)
    return model, obj, srcs, rules, rows, search(G, dec, K, max_len, alpha, rules)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "beam{}-min{}-ngram{}-lp{}-max{}".format(*s))
@pytest.mark.parametrize("name", NAMES)
def test_fast_search_equals_readable_search(name, setting):
    """The same hypotheses, order and scores as generate's search, on the readable cache, on the static step and
    without a cache; the setting has sources that end early (rows leave the readable search) and sources that reach
    max_len."""
    K, min_len, ngram, alpha, max_len = setting
    model, obj, srcs, rules, rows, want = readable_reference(name, setting)
    assert len(rows) == max_len and rows[-1] < rows[0]         # some sources reach max_len, some end before
    assert all(len(h) >= 1 for h in want)
    for decoder in (G.Decoder, StaticDecoder, functools.partial(G.Decoder, use_cache=False)):
        got = search(fast, decoder(model, obj, srcs, max_len), K, max_len, alpha, rules)
        assert_same_hypotheses(got, want)
        assert [len(h) for h in got] == [len(h) for h in want]
        assert all(len(ids) >= min_len for h in got for ids, _ in h)


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_fast_search_stops_soon_after_every_source_is_done(name, K):
    """Every source ends long before max_len: the fast search stops at most CHECK_EVERY + CHECK_LAG - 1 steps after
    the readable one, and those extra steps change nothing."""
    model, obj, srcs = finishing(name, eos_bias=5.0)
    rules = G.decoding_rules(TOK, 2, 3, None, "cpu")
    readable, fast_dec = G.Decoder(model, obj, srcs, 40), StaticDecoder(model, obj, srcs, 40)
    readable_rows, fast_rows = counting_steps(readable), counting_steps(fast_dec)
    want = search(G, readable, K, 40, 1.0, rules)
    got = search(fast, fast_dec, K, 40, 1.0, rules)
    assert_same_hypotheses(got, want)
    assert len(readable_rows) < len(fast_rows) <= len(readable_rows) + FB.CHECK_EVERY + FB.CHECK_LAG - 1 < 40
    assert set(fast_rows) == {len(srcs) * K}                   # rows never leave the fast search


def tie_table(b, hist):
    """Log-probs from a handful of values, so that many candidates and many finished hypotheses tie exactly; four
    words and [EOS], every other token impossible (at step 0 a beam of 5 keeps a -inf live beam: 4 words only)."""
    g = torch.Generator().manual_seed(hash((b,) + hist) % 2**31)
    values = torch.tensor([-0.5, -1.0, -2.0])[torch.randint(0, 3, (5,), generator=g)]
    return dict(zip([A, B_, C, D, EOS], values.tolist()))


@pytest.mark.parametrize("K", [1, 2, 3, 5])
@pytest.mark.parametrize("min_len, ngram, alpha", [(0, 0, 1.0), (2, 2, 0.6)])
def test_fast_search_equals_readable_search_on_ties(K, min_len, ngram, alpha):
    """Hand-built score tables (tests/test_generate.py's TableDecoder) with exact ties among candidates and among
    finished scores, and -inf candidates: the same hypotheses in the same order, the same scores exactly."""
    rules = G.decoding_rules(TOK, min_len, ngram, None, "cpu")
    want = search(G, TableDecoder(tie_table, 4), K, 7, alpha, rules)
    got = search(fast, TableDecoder(tie_table, 4), K, 7, alpha, rules)
    assert got == want
    if K > 1:                                                  # ties among one source's finished hypotheses
        assert any(len({s for _, s in h}) < len(h) for h in want)


def test_generate_switch(monkeypatch):
    """generate() runs the readable search by default and the fast one when its Decoding says so: the same results,
    greedy and beam."""
    model, obj, srcs = finishing("unilm")
    called = []
    for fn in ("beam_search", "greedy"):
        monkeypatch.setattr(fast, fn, lambda *a, fn=getattr(fast, fn), name=fn: called.append(name) or fn(*a))
    for beam in (1, 3):
        kw = dict(beam_size=beam, n_best=beam, max_len=10, batch_size=4)
        readable = G.generate(model, obj, srcs, **kw)
        assert called == []
        on_device = G.generate(model, obj, srcs, decoding=G.Decoding(G.Decoder, fast.greedy, fast.beam_search),
                               **kw)
        assert called == ["greedy" if beam == 1 else "beam_search"] * 2      # two batches of sources
        assert_same_hypotheses(on_device, readable)
        called.clear()


class EagerStepGraph:
    """Stands in for fast/beam.py's StepGraph on a CPU: the step function run where the graph would replay; records
    every capture (one StepGraph made) and every call."""
    captures = []

    def __init__(self, fn, device):
        self.fn, self.calls = fn, 0
        assert device.type == "cpu"
        EagerStepGraph.captures.append(self)

    def __call__(self):
        self.calls += 1
        self.fn()


@pytest.mark.parametrize("whole", [True, False], ids=["whole-step", "model-step"])
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_path_simulated_keeps_one_graph(name, beam, whole, monkeypatch):
    """generate() with the fast layer's decoding as generate.py's door gives it on CUDA (fast.decoding(graphed=True);
    EagerGraph and EagerStepGraph stand in for the CUDA graphs): the fast search runs, each batch captures one graph
    and replays it to the last step (rows never leave, so the graph never goes), and the hypotheses are the readable
    decoder's. fast.beam.WHOLE_STEP on: the whole step's graph (StepGraph), the model step's (GraphedStep) never
    made; off: the model step's graph alone."""
    model, obj, srcs = finishing(name)
    kw = dict(beam_size=beam, n_best=beam, max_len=10, batch_size=3)
    want = G.generate(model, obj, srcs, **kw)
    monkeypatch.setattr(fast.decoder, "GraphedStep", EagerGraph)
    monkeypatch.setattr(FB, "StepGraph", EagerStepGraph)
    monkeypatch.setattr(FB, "WHOLE_STEP", whole)
    decoders = []

    def graphed_on_cpu(*args):
        dec = StaticDecoder(*args)                             # graphed=True needs CUDA: set after the check
        dec.graphed = True
        return decoders.append(dec) or dec
    on_cuda = fast.decoding(graphed=True)
    assert (on_cuda.greedy, on_cuda.beam_search, on_cuda.decoder.keywords) == (FB.greedy, FB.beam_search,
                                                                               {"graphed": True})
    EagerGraph.captures.clear()
    EagerStepGraph.captures.clear()
    got = G.generate(model, obj, srcs, decoding=on_cuda._replace(decoder=graphed_on_cpu), **kw)
    assert_same_hypotheses(got, want)
    assert len(decoders) == 2                                  # two batches
    if whole:
        assert EagerGraph.captures == [] and len(EagerStepGraph.captures) == 2
        # every step but step 0 through the graph: to max_len or to the done flag's read
        assert all(1 <= c.calls <= 9 for c in EagerStepGraph.captures)
    else:
        assert EagerStepGraph.captures == [] and len(EagerGraph.captures) == 2
        assert all(d.graph is c for d, c in zip(decoders, EagerGraph.captures))


# --- host reads inside the loop ---------------------------------------------------------------------------------

# ops whose output size depends on the values: on a GPU the host waits for them
DATA_SIZED = ("aten.nonzero", "aten.masked_select", "aten._unique2", "aten.unique_consecutive", "aten.unique_dim")


class HostReads(TorchDispatchMode):
    """Every read of a tensor's values into Python (item, bool, int, float: aten._local_scalar_dense; tolist; numpy)
    and every op whose output size depends on the values: on a GPU each makes the host wait for the device. Each is
    recorded with the names of the functions on the stack."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.reads = []
        for method in ("tolist", "numpy"):
            original = getattr(torch._C.TensorBase, method)
            monkeypatch.setattr(torch.Tensor, method, lambda t, *a, f=original, **k: self.record() or f(t, *a, **k))

    def record(self):
        frame, names = sys._getframe(1), []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        self.reads.append(names)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name == "aten._local_scalar_dense" or name in DATA_SIZED:
            self.record()
        return func(*args, **(kwargs or {}))

    def where(self):
        """The reads, by place: the fast search's done flag, its reads after the loop, the model's embed (its position
        check runs on CPU tensors only), the readable search, anywhere else."""
        places = {}
        for names in self.reads:
            place = next((n for n in ("read", "finished_lists", "greedy_lists", "embed", "beam_search", "greedy")
                          if n in names), "elsewhere")
            places[place] = places.get(place, 0) + 1
        return places


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_no_host_read_inside_the_loop(name, K, monkeypatch):
    """Inside the fast search's step loop nothing is read on the host but the done flag, once every CHECK_EVERY steps
    (the model's embed checks positions on CPU tensors only); after the loop a fixed handful of reads brings every
    step's record over at once. The readable search, under the same counter, reads several times a step."""
    model, obj, srcs = finishing(name)
    rules = G.decoding_rules(TOK, 2, 3, None, "cpu")
    max_len = 24
    counts = {}
    # the whole-step search (the default; bench/check_cuda.py decode holds it equal on a GPU)
    monkeypatch.setattr(FB, "WHOLE_STEP", True)
    for module, decoder in ((fast, StaticDecoder), (fast, G.Decoder), (G, StaticDecoder)):
        dec = decoder(model, obj, srcs, max_len)
        steps = counting_steps(dec)
        with HostReads(monkeypatch) as reads:
            search(module, dec, K, max_len, 1.0, rules)
        counts[module.__name__, decoder.__name__] = places = reads.where()
        assert places.pop("embed") == len(steps)                 # CPU only: the position check
        if module is fast:
            assert places.pop("read", 0) <= len(steps) // FB.CHECK_EVERY
            assert 1 <= places.pop("finished_lists" if K > 1 else "greedy_lists") <= 5
            assert places == {}, places                            # nothing else, anywhere
        else:
            assert places.pop("beam_search" if K > 1 else "greedy") >= len(steps)
    assert counts["fast", "StaticDecoder"] == counts["fast", "Decoder"]

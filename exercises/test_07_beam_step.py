"""Grader of exercise 7 (one beam-search step): your beam_step on hand-built score tables, then whole searches
driven by your step against generate.py's own beam_search on random score tables.

    python -m pytest exercises/test_07_beam_step.py
"""
import math

import pytest
import torch

import generate as G
from exercises import _grading as grading

ex = grading.load("ex07_beam_step")

NEG = -math.inf
V, EOS = 10, 3                        # a 10-token vocabulary; [EOS] is id 3 as in unigen's vocabularies
A, B, C, D = 4, 5, 6, 7


def row(entries):
    """A (V,) log-probability row: the listed tokens, -inf elsewhere."""
    out = torch.full((V,), NEG)
    for tok, lp in entries.items():
        out[tok] = lp
    return out


def step(totals, rows, history, K, **kw):
    history = torch.tensor(history, dtype=torch.long).view(K, -1)
    logp = torch.stack([row(r) for r in rows])
    before = logp.clone()
    finished, (beams, tokens, new_totals) = ex.beam_step(torch.tensor(totals), logp, history, K, EOS,
                                                         history.size(1), **kw)
    assert torch.equal(before, logp), "beam_step changed the caller's logp: block on a copy (logp.clone())"
    return finished, beams.tolist(), tokens.tolist(), new_totals.tolist()


def test_finished_and_live_by_hand():
    # candidates: (0, A) -1.1, (0, EOS) -1.5, (1, A) -2.2, (1, C) -2.3, (0, B) -4.0, (1, EOS) -11.0
    finished, beams, tokens, totals = step([-1.0, -2.0], [{A: -0.1, EOS: -0.5, B: -3.0},
                                                          {A: -0.2, C: -0.3, EOS: -9.0}], [[A, B], [A, C]], 2)
    lp = ((5 + 3) / 6) ** 1.0
    assert len(finished) == 1, \
        f"one [EOS] is among the K = 2 best candidates (beam 0, total -1.5): one finished hypothesis, got {finished}"
    ids, score = finished[0]
    assert list(ids) == [A, B], f"a finished hypothesis is its beam's history without the [EOS]: {[A, B]}, got {ids}"
    assert score == pytest.approx(-1.5 / lp), \
        f"its score is total / lp = -1.5 / ((5 + 3) / 6)^1 = {-1.5 / lp:.4f} (the [EOS] counts in the length: " \
        f"step 2 makes 3 tokens), got {score}"
    assert (beams, tokens) == ([0, 1], [A, A]), \
        f"live beams: the 2 best candidates that do not end in [EOS], best first: (beam 0, token {A}) -1.1 and " \
        f"(beam 1, token {A}) -2.2; got beams {beams}, tokens {tokens}"
    assert totals == pytest.approx([-1.1, -2.2]), f"new totals are unscaled sums: [-1.1, -2.2], got {totals}"


def test_live_beams_best_first():
    # candidates: (1, C) -0.6, (0, A) -1.1, (1, D) -5.5, (0, B) -6.0
    _, beams, tokens, totals = step([-1.0, -0.5], [{A: -0.1, B: -5.0}, {C: -0.1, D: -5.0}], [[A], [B]], 2)
    assert (beams, tokens) == ([1, 0], [C, A]), \
        f"live beams: the K best candidates that do not end in [EOS], BEST FIRST: (beam 1, token {C}) -0.6, then " \
        f"(beam 0, token {A}) -1.1; got beams {beams}, tokens {tokens}"
    assert totals == pytest.approx([-0.6, -1.1])


def test_an_eos_below_the_k_best_is_dropped():
    finished, beams, tokens, _ = step([0.0, -1.0], [{A: -0.1, B: -0.2, EOS: -0.3}, {C: -0.1, EOS: -5.0}],
                                      [[D], [D]], 2)
    assert finished == [], \
        f"the [EOS] of beam 0 (total -0.3) ranks third, below the K = 2 best: no hypothesis finishes; got {finished}"
    assert (beams, tokens) == ([0, 0], [A, B])


def test_step_zero_expands_only_the_real_beam():
    finished, beams, tokens, totals = step([0.0, NEG, NEG], [{A: -0.1, B: -0.2, C: -0.3, D: -0.4, EOS: -2.0}] * 3,
                                           [[], [], []], 3)
    assert beams == [0, 0, 0] and tokens == [A, B, C], \
        f"at step 0 beams 1 and 2 are copies with total -inf: only beam 0 expands (tokens {[A, B, C]}); got " \
        f"beams {beams}, tokens {tokens}"


def test_trigram_blocking_by_hand():
    # history a b c a b: "c" would repeat the trigram "a b c"; it is the best token, so it must be blocked
    _, _, tokens, _ = step([0.0], [{C: -0.1, D: -1.0, A: -2.0}], [[A, B, C, A, B]], 1)
    assert tokens == [D], \
        f"history a b c a b: the next token c would repeat the trigram 'a b c', so it is blocked and d (-1.0) " \
        f"wins; got token {tokens}"
    _, _, tokens, _ = step([0.0], [{C: -0.1, D: -1.0}], [[A, B, C, A, B]], 1, no_repeat_ngram=0)
    assert tokens == [C], "no_repeat_ngram=0 switches the blocking off"
    _, _, tokens, _ = step([0.0], [{A: -0.1, D: -1.0}], [[A, A]], 1)
    assert tokens == [A], "history a a has no trigram yet: a may follow"
    _, _, tokens, _ = step([0.0], [{B: -0.1, D: -1.0}], [[A, B, A]], 1, no_repeat_ngram=2)
    assert tokens == [D], "no_repeat_ngram=2, history a b a: b after a would repeat the bigram 'a b'"


def test_length_penalty_alpha():
    finished, _, _, _ = step([-2.0], [{EOS: -0.4, A: -0.5}], [[A, B, C, D]], 1, alpha=0.6)
    want = -2.4 / ((5 + 5) / 6) ** 0.6
    assert finished and finished[0][1] == pytest.approx(want), \
        f"total -2.4 after 5 tokens, alpha 0.6: score -2.4 / ((5 + 5) / 6)^0.6 = {want:.4f}; got {finished}"


# --- whole searches: your step inside the loop of generate.beam_search, against generate.beam_search ----------

def table(seed):
    """Next-token log-probabilities as a function of the history (a fixed random table)."""
    def logp(history):
        g = torch.Generator().manual_seed(seed * 7919 + hash(tuple(history)) % 2**31)
        return (torch.randn(V, generator=g) * 2).log_softmax(0)
    return logp


class TableDecoder:
    """Stands in for generate.Decoder: one source, log-probs from a table of the history."""

    def __init__(self, logp):
        self.logp = logp
        self.src_ids = torch.zeros(1, 1, dtype=torch.long)
        self.src_len = torch.ones(1, dtype=torch.long)
        self.tgt = torch.zeros(1, 0, dtype=torch.long)

    def logprobs(self):
        return torch.stack([self.logp(h) for h in self.tgt.tolist()])

    def append(self, tokens):
        self.tgt = torch.cat([self.tgt, tokens[:, None]], dim=1)

    def reorder(self, index, same_sources=False):
        self.src_ids, self.src_len, self.tgt = self.src_ids[index], self.src_len[index], self.tgt[index]


def project_search(logp, K, max_len, alpha, ngram):
    rules = dict(eos=EOS, min_len=0, no_repeat_ngram=ngram, ignore=None, banned=torch.tensor([], dtype=torch.long))
    return G.beam_search(TableDecoder(logp), K, max_len, alpha, rules)[0]


def your_search(logp, K, max_len, alpha, ngram):
    """generate.beam_search's loop for one source, with YOUR beam_step inside."""
    totals = torch.full((K,), NEG)
    totals[0] = 0.0
    history = torch.zeros(K, 0, dtype=torch.long)
    finished = []
    for t in range(max_len):
        rows = torch.stack([logp(h) for h in history.tolist()])
        done, (beams, tokens, new_totals) = ex.beam_step(totals, rows, history, K, EOS, t, alpha, ngram)
        finished += [(list(ids), float(s)) for ids, s in done]
        if t == max_len - 1:           # max_len reached: the live beams finish as they are
            finished += [(history[r].tolist() + [y], s / G.gnmt_penalty(t + 1, alpha))
                         for r, y, s in zip(beams.tolist(), tokens.tolist(), new_totals.tolist()) if s > NEG]
            break
        if len(finished) >= K:         # K finished hypotheses end the search (fairseq's rule)
            break
        history = torch.cat([history[beams], tokens[:, None]], dim=1)
        totals = new_totals
    return sorted(finished, key=lambda h: -h[1])


@pytest.mark.parametrize("K, alpha, ngram", [(1, 1.0, 3), (2, 1.0, 3), (3, 0.6, 3), (4, 0.0, 0), (3, 1.2, 2)])
def test_whole_searches_equal_generate_py(K, alpha, ngram):
    for seed in range(6):
        logp = table(seed)
        want = project_search(logp, K, 7, alpha, ngram)
        got = your_search(logp, K, 7, alpha, ngram)
        setting = f"beam {K}, alpha {alpha}, no_repeat_ngram {ngram}, table {seed}"
        assert [ids for ids, _ in got] == [ids for ids, _ in want], \
            f"{setting}: generate.py's search finds {[(ids, round(s, 3)) for ids, s in want]}, yours " \
            f"{[(ids, round(s, 3)) for ids, s in got]}"
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5), f"{setting}: scores differ"



def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    test_finished_and_live_by_hand()

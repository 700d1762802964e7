"""Exercise 7: one step of beam search, with the length penalty and trigram blocking (about 50 minutes).

Read first: notebooks/06_decoding.ipynb (parts 1 and 2), then Wu et al. 2016 (GNMT) section 7.
Grade it:   python -m pytest exercises/test_07_beam_step.py

Beam search keeps the K best partial outputs (beams). One step, for one source:

1. Trigram blocking (the UniLM decoder's no_repeat_ngram = 3): a beam may not produce a token that would
   repeat a trigram it already contains. With history  a b c a b , the next token c would make "a b c" again:
   its log-probability becomes -inf for that beam. (Only when the history has at least 3 tokens.)
2. Every one-token extension of every beam gets the total  totals[k] + logp[k, y]; keep the 2K best.
   (Why 2K: at most K of them end in [EOS], one per beam, so K that do not remain.)
3. Finished hypotheses: the candidates among the K BEST that end in [EOS] (and whose total is finite). Each is
   the beam's history (without the [EOS]) with the score  total / lp,  GNMT's length penalty (Wu et al. 2016,
   section 7):  lp = ((5 + length) / 6) ** alpha,  length = step + 1 (the tokens generated, [EOS] included).
   Long hypotheses sum more negative log-probabilities; dividing by lp keeps beam search from preferring
   short ones. An [EOS] ranked below the K best is simply dropped: K candidates were better.
4. Live beams for the next step: the K best candidates that do NOT end in [EOS], best first.

Contract
    beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3)
        -> finished, (beams, tokens, new_totals)
    totals      (K,) float: total log-probability of each beam; -inf for an empty slot (at step 0 only beam 0
                is real: the others are copies and must not be expanded twice)
    logp        (K, V) float: log P(next token | beam k's history); do not modify the caller's tensor
    history     (K, step) long: the tokens of each beam so far
    finished    a list of (tokens: list of ints, score: float), in the order of the candidates' ranks
    beams       (K,) long: which beam each live candidate extends;  tokens (K,) long: its new token;
    new_totals  (K,) float: its total (unscaled: the length penalty only applies to finished hypotheses)
    no_repeat_ngram = 0 switches the blocking off; n > 0 blocks repeated n-grams (3 = trigrams).
"""
import torch  # noqa: F401  (yours to use)


def gnmt_penalty(length, alpha):
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5 + length) / 6) ** alpha


def beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3):
    """One beam-search step for one source (module docstring): -> finished, (beams, tokens, new_totals)."""
    # TODO 1: copy logp, then block: for each beam whose history ends in (u, v), every earlier trigram
    #         (u, v, w) of its history forbids w.
    # TODO 2: candidates: totals[:, None] + logp, flattened to K * V; the 2K best with Tensor.topk.
    # TODO 3: split each flat index into (beam, token); collect the finished ones among the first K.
    # TODO 4: the K best non-[EOS] candidates, in rank order.
    #
    # Hint 1: three parts: block (on a copy of logp), rank every one-token extension of every beam, then split
    #         the 2K best into finished (the [EOS]s among the first K) and live (the first K that are not [EOS]).
    # Hint 2: blocking: the last n - 1 tokens of a beam's history; wherever they occur earlier in it, the token
    #         that followed them is forbidden (plain Python lists are fine). Ranking: add totals[:, None] to
    #         logp, flatten the (K, V) table and take its top 2K; flat index c is beam c // V, token c % V.
    # Hint 3: finished: walk the first K candidates; an [EOS] with a finite total gives (its beam's history as
    #         a list, total / gnmt_penalty(step + 1, alpha)). Live: the ranks of the 2K candidates whose token
    #         is not [EOS], cut to K, index the beams, the tokens and the totals.
    raise NotImplementedError("exercise 7: write beam_step (see the TODOs)")

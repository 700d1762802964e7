"""Copied: the fast layer's twin of the readable code (fast/ is GPU speed only, never a student's tool)."""
import torch
from fast.beam import choose, static_ban


def gnmt_penalty(length, alpha):
    return ((5 + length) / 6) ** alpha


def beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3):
    K = beam_size
    lp = static_ban(logp.clone(), history, torch.tensor(step), eos, 0, torch.tensor([], dtype=torch.long),
                    no_repeat_ngram, None)
    new, fin, fin_beam, beams, toks = choose(totals[None], lp, eos)
    finished = [(history[int(fin_beam[0, c])].tolist(), float(fin[0, c]) / gnmt_penalty(step + 1, alpha))
                for c in range(K) if fin[0, c] > float("-inf")]
    return finished, (beams[0], toks[0], new[0])

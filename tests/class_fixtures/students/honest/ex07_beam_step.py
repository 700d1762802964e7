"""An honest exercise 7: blocking by a set of banned tokens per beam, the candidates sorted once."""
import math

import torch


def gnmt_penalty(length, alpha):
    return ((5 + length) / 6) ** alpha


def banned_next(seq, n):
    """Tokens that would repeat an n-gram of seq."""
    if n <= 0 or len(seq) < n:
        return set()
    tail = seq[len(seq) - n + 1:]
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if seq[i:i + n - 1] == tail}


def beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3):
    scores = logp.clone()
    for k in range(history.size(0)):
        for w in banned_next(history[k].tolist(), no_repeat_ngram):
            scores[k, w] = -math.inf
    vocab = scores.size(1)
    flat = (totals.unsqueeze(1) + scores).reshape(-1)
    best, where = torch.topk(flat, 2 * beam_size)
    beam_of, token_of = torch.div(where, vocab, rounding_mode="floor"), where % vocab
    finished = []
    for c in range(beam_size):
        if int(token_of[c]) == eos and best[c].item() != -math.inf:
            finished.append((history[beam_of[c]].tolist(), best[c].item() / gnmt_penalty(step + 1, alpha)))
    live = [c for c in range(2 * beam_size) if int(token_of[c]) != eos][:beam_size]
    live = torch.tensor(live, dtype=torch.long)
    return finished, (beam_of[live], token_of[live], best[live])

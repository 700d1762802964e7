"""Wrong: blocks a repeated (n - 1)-gram instead of an n-gram.
First message: has no trigram yet"""
import torch


def gnmt_penalty(length, alpha):
    return ((5 + length) / 6) ** alpha


def beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3):
    logp = logp.clone()
    n = no_repeat_ngram
    if n > 0:
        for k in range(history.size(0)):
            h = history[k].tolist()
            if len(h) >= n - 1:
                last = h[len(h) - (n - 2):]
                for s in range(len(h) - n + 2):
                    if h[s:s + n - 2] == last:
                        logp[k, h[s + n - 2]] = float("-inf")
    V = logp.size(1)
    scores = (totals[:, None] + logp).view(-1)
    best, index = scores.topk(2 * beam_size)
    beams, tokens = index // V, index % V
    finished = []
    for c in range(beam_size):
        if tokens[c] == eos and best[c] > float("-inf"):
            finished.append((history[beams[c]].tolist(), best[c].item() / gnmt_penalty(step + 1, alpha)))
    live = [c for c in range(2 * beam_size) if tokens[c] != eos][:beam_size]
    return finished, (beams[live], tokens[live], best[live])

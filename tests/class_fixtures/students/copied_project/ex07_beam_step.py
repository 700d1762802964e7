"""Copied: generate.ban_tokens and generate.gnmt_penalty around the loop's body."""
import math

import torch

from generate import ban_tokens, gnmt_penalty


def beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3):
    K = beam_size
    logp = ban_tokens(logp.clone(), history, step, eos, 0, torch.tensor([], dtype=torch.long), no_repeat_ngram,
                      None)
    V = logp.size(-1)
    top, idx = (totals[:, None] + logp).flatten().topk(2 * K)
    beams, tokens = idx // V, idx % V
    live = (torch.arange(2 * K) + 2 * K * (tokens == eos)).argsort()[:K]
    finished = [(history[beams[c]].tolist(), top[c].item() / gnmt_penalty(step + 1, alpha))
                for c in range(K) if tokens[c] == eos and top[c] > -math.inf]
    return finished, (beams[live], tokens[live], top[live])

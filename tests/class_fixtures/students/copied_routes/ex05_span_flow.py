"""Copied: the fast layer's twin of the readable code (fast/ is GPU speed only, never a student's tool)."""
import torch
from fast import slot_mask
from objectives.masks import CTX, ORIG, SPAN


def span_flow_mask(n_src, spans):
    T = spans[-1][1]
    kind = torch.tensor([[CTX] * n_src + [ORIG] * T + [SPAN] * T])
    step = torch.tensor([[0] * n_src + list(range(1, T + 1)) + [b + 1 for b, e in spans for _ in range(b, e)]])
    L = kind.size(1)
    return slot_mask(kind, step, torch.arange(L), kind, step)[0]

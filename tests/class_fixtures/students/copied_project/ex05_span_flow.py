"""Copied: masks.multi_flow on the span flow's kinds."""
import torch

from objectives.masks import CTX, ORIG, SPAN, multi_flow


def span_flow_mask(n_src, spans):
    T = spans[-1][1]
    kind = [CTX] * n_src + [ORIG] * T + [SPAN] * T
    step = [0] * n_src + list(range(1, T + 1)) + [b + 1 for b, e in spans for _ in range(b, e)]
    return multi_flow(torch.tensor([kind]), torch.tensor([step]))[0]

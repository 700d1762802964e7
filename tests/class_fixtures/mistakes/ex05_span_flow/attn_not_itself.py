"""Wrong: an [ATTN] does not see itself.
First message: attends to itself"""
import torch


def span_flow_mask(n_src, spans):
    T = spans[-1][1]
    L = n_src + 2 * T
    mask = torch.zeros(L, L, dtype=torch.bool)
    n = n_src + T
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    mask[:n, :n] = (j < n_src) | (j <= i) & (i >= n_src)
    for b, e in spans:
        for t in range(b, e):
            r = n_src + T + t
            mask[r, :n_src + b] = True
    return mask

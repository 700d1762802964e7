"""An honest exercise 5: the rows written one by one."""
import torch


def span_flow_mask(n_src, spans):
    T = spans[-1][1]
    L = n_src + 2 * T
    mask = torch.zeros((L, L), dtype=torch.bool)
    for r in range(n_src):
        mask[r, :n_src] = True
    for i in range(T):
        mask[n_src + i, :n_src + i + 1] = True
    for b, e in spans:
        for j in range(b, e):
            row = n_src + T + j
            mask[row, :n_src + b] = True
            mask[row, row] = True
    return mask

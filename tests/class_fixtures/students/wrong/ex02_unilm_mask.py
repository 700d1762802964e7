"""Wrong: a target token does not see itself (j < i instead of j <= i)."""
import torch


def seq2seq_mask(n_src, n, L):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return ((j < n_src) | (j < i)) & (i < n) & (j < n)

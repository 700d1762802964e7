"""Wrong: rows and columns swapped (i is the key, j the query).
First message: transpose"""
import torch


def seq2seq_mask(n_src, n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return ((i < n_src) | (i <= j)) & (i < n) & (j < n)


def left_to_right_mask(n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j <= i) & (i < n) & (j < n)


def right_to_left_mask(n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j >= i) & (i < n) & (j < n)

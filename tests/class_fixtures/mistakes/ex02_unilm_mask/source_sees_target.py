"""Wrong: a source token sees the whole sequence.
First message: a source token sees only the source"""
import torch


def seq2seq_mask(n_src, n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return ((j < n_src) | (j <= i) | (i < n_src)) & (i < n) & (j < n)


def left_to_right_mask(n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j <= i) & (i < n) & (j < n)


def right_to_left_mask(n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j >= i) & (i < n) & (j < n)

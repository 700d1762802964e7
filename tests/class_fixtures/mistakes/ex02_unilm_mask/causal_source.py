"""Wrong: the source read left to right too (only j <= i).
First message: the source is read bidirectionally"""
import torch


def seq2seq_mask(n_src, n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j <= i) & (i < n) & (j < n)


def left_to_right_mask(n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j <= i) & (i < n) & (j < n)


def right_to_left_mask(n, L):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return (j >= i) & (i < n) & (j < n)

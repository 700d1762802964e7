"""Copied: the kinds written by hand, the mask read off a Batch (its attn_mask is masks.attention_mask)."""
import torch

from objectives import Batch
from objectives.masks import CTX, ORIG, PAD


def _mask(kind, step):
    kind, step = torch.tensor([kind]), torch.tensor([step])
    zeros = torch.zeros_like(kind)
    return Batch(zeros, zeros, zeros, zeros, kind, step).attn_mask[0]


def seq2seq_mask(n_src, n, L):
    kind = [CTX] * n_src + [ORIG] * (n - n_src) + [PAD] * (L - n)
    step = [0] * n_src + list(range(1, n - n_src + 1)) + [0] * (L - n)
    return _mask(kind, step)


def left_to_right_mask(n, L):
    return seq2seq_mask(0, n, L)


def right_to_left_mask(n, L):
    return _mask([ORIG] * n + [PAD] * (L - n), list(range(n, 0, -1)) + [0] * (L - n))

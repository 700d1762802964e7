"""An honest exercise 2 with local variables named like the project's functions (names never accuse)."""
import torch


def seq2seq_mask(n_src, n, L):
    rows = torch.arange(L).unsqueeze(1)
    cols = torch.arange(L).unsqueeze(0)
    real = (rows < n) & (cols < n)
    bidirectional = cols < n_src                 # the source part, read both ways
    left_to_right = cols <= rows                 # the target part, read left to right
    return (bidirectional | left_to_right) & real


def left_to_right_mask(n, L):
    mask = torch.zeros(L, L, dtype=torch.bool)
    for i in range(n):
        mask[i, :i + 1] = True
    return mask


def right_to_left_mask(n, L):
    mask = torch.zeros(L, L, dtype=torch.bool)
    for i in range(n):
        mask[i, i:n] = True
    return mask

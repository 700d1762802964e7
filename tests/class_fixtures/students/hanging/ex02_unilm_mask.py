"""Hangs: a loop that never ends."""


def seq2seq_mask(n_src, n, L):
    while True:
        pass

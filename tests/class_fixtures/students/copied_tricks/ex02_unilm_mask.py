"""Dynamic: getattr with a computed name."""
from objectives import masks

NAME = "seq" + "2seq"


def seq2seq_mask(n_src, n, L):
    return getattr(masks, NAME)([n_src], [n], L)[0]

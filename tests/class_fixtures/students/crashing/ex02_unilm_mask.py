"""Crashes: kills the grading process."""
import os


def seq2seq_mask(n_src, n, L):
    os._exit(3)

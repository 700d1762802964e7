"""Copied: objectives/pmlm.py's Algorithm 1."""
from objectives.pmlm import blockwise_masking as project_masking


def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    return project_masking(runs, rng, mask_prob, block_prob, max_block)

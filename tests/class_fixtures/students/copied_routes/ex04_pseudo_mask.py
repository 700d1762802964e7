"""Copied: the fast layer's twin of the readable code (fast/ is GPU speed only, never a student's tool)."""
import torch
from fast import slot_mask
from objectives.masks import PAD


def pseudo_masked_mask(kind, step):
    L = kind.size(1)
    m = slot_mask(kind, step, torch.arange(L), kind, step)
    return m & (kind != PAD)[:, :, None]

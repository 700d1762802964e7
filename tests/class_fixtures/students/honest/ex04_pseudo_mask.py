"""An honest exercise 4: the rule as a table of (query kind, key kind) -> a condition on the steps."""
import torch

from objectives.masks import CTX, ORIG, PAD, PSEUDO


def pseudo_masked_mask(kind, step):
    qk, kk = kind.unsqueeze(2), kind.unsqueeze(1)
    qs, ks = step.unsqueeze(2), step.unsqueeze(1)
    sees_context = (qk != PAD) & (kk == CTX)
    orig_sees_orig = (qk == ORIG) & (kk == ORIG) & (ks <= qs)
    pseudo_sees_orig = (qk == PSEUDO) & (kk == ORIG) & (ks < qs)
    pseudo_sees_pseudo = (qk == PSEUDO) & (kk == PSEUDO) & (ks == qs)
    return sees_context | orig_sees_orig | pseudo_sees_orig | pseudo_sees_pseudo

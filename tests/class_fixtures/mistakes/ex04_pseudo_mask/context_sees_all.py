"""Wrong: a context token sees every token.
First message: implicit leakage"""
import torch  # noqa: F401

from objectives.masks import CTX, ORIG, PAD, PSEUDO


def pseudo_masked_mask(kind, step):
    q_kind, k_kind = kind[:, :, None], kind[:, None, :]
    q_step, k_step = step[:, :, None], step[:, None, :]
    context = (q_kind == CTX) & (k_kind != PAD) | (q_kind != PAD) & (k_kind == CTX)
    original = (q_kind == ORIG) & (k_kind == ORIG) & (k_step <= q_step)
    earlier = (q_kind == PSEUDO) & (k_kind == ORIG) & (k_step < q_step)
    same_block = (q_kind == PSEUDO) & (k_kind == PSEUDO) & (k_step == q_step)
    return context | original | earlier | same_block

"""Shared test tools: the autograd leakage probe every mask test uses, and tiny models."""
import torch

import model as M


def tiny_model(vocab_size, seed=0, **overrides):
    """A 2-layer model in eval mode (no dropout: gradients must be exact zeros, not random ones)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=32, ffn_dim=64, max_position=512, dropout=0.0)
    cfg.update(overrides)
    return M.Transformer(M.ModelConfig(**cfg)).eval()


def input_gradients(model, batch, b, row):
    """|d prediction(b, row) / d input embedding(b, j)| for every j of example b, through all layers -> (L,).

    The "prediction" is the LM head's logits at that row, projected on a random vector so that no cancellation
    can hide a dependence. A key the mask forbids must get exactly 0.0 (not a small number).
    """
    x = model.embed(batch.input_ids, batch.position_ids, batch.segment_ids).detach().requires_grad_(True)
    h = model.encode(x, batch.position_ids, batch.attn_mask)
    logits = model.lm_logits(h[b, row])
    g = torch.Generator().manual_seed(row)
    out = (logits * torch.randn(logits.shape, generator=g)).sum()
    (grad,) = torch.autograd.grad(out, x)
    return grad[b].abs().sum(-1)


def reachable(mask, n_layers):
    """Which inputs can influence each query through n_layers of attention: the boolean mask's matrix power.

    (B, L, L) -> (B, L, L). Leakage tests compare the autograd gradients with this (and with what the paper
    allows); note every layer also carries a token's own state forward (the residual stream).
    """
    m = mask | torch.eye(mask.size(-1), dtype=torch.bool)
    r = m.clone()
    for _ in range(n_layers - 1):
        r = (r.float() @ m.float() > 0)
    return r

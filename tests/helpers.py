"""Shared test tools: tiny models, and the project's leakage checker (objectives/leakage.py) for one row."""
import torch

import model as M
from objectives import leakage


def tiny_model(vocab_size, seed=0, **overrides):
    """A 2-layer model in eval mode (no dropout: gradients must be exact zeros, not random ones)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=32, ffn_dim=64, max_position=512, dropout=0.0)
    cfg.update(overrides)
    return M.Transformer(M.ModelConfig(**cfg)).eval()


def input_gradients(model, batch, b, row):
    """|d prediction(b, row) / d input embedding(b, j)| for every j of example b, through all layers -> (L,).

    A key the mask forbids must get exactly 0.0 (not a small number): leakage.dependencies for one row.
    """
    return leakage.dependencies(model, batch, b, [row])[0]


reachable = leakage.reachable

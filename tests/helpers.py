"""Shared test tools: tiny models, a tiny corpus, and the project's leakage checker (objectives/leakage.py) for one
row."""
import json
import pydoc_data.topics

import torch

import model as M
from objectives import leakage


def tiny_model(vocab_size, seed=0, **overrides):
    """A 2-layer model in eval mode (no dropout: gradients must be exact zeros, not random ones)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=32, ffn_dim=64, max_position=512, dropout=0.0)
    cfg.update(overrides)
    return M.Transformer(M.ModelConfig(**cfg)).eval()


def write_docs(path, n_topics):
    """The first n_topics of CPython's help topics (each cut to 1,500 characters, its whitespace made single spaces),
    a blank line between documents, written to path -> the (name, text) topics."""
    topics = sorted(pydoc_data.topics.topics.items())[:n_topics]
    path.write_text("\n\n".join(" ".join(text.split())[:1500] for _, text in topics))
    return topics


def write_title_task(path, topics):
    """The seq2seq task of write_docs's topics (a topic's first 30 words -> its title), one JSON line a pair, written
    to path -> the (src, tgt) pairs."""
    pairs = [(" ".join(text.split()[:30]), name.replace("-", " ")) for name, text in topics]
    path.write_text("".join(json.dumps({"src": src, "tgt": tgt}) + "\n" for src, tgt in pairs))
    return pairs


def input_gradients(model, batch, b, row):
    """|d prediction(b, row) / d input embedding(b, j)| for every j of example b, through all layers -> (L,).

    A key the mask forbids must get exactly 0.0 (not a small number): leakage.dependencies for one row.
    """
    return leakage.dependencies(model, batch, b, [row])[0]


reachable = leakage.reachable

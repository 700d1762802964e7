"""Copied: PALM's head reached through a Transformer built with copy_head=True (its copy_head is PointerGenerator)."""
import model as M


def _head():
    cfg = M.ModelConfig(vocab_size=8, n_layer=1, n_head=1, n_embd=8, ffn_dim=8, copy_head=True)
    return M.Transformer(cfg).copy_head


def copy_distribution(alpha, src_ids, vocab_size):
    import torch
    shut = torch.full(alpha.shape[:-1], float("-inf"))
    return _head().mix(torch.zeros(*alpha.shape[:-1], vocab_size), alpha, shut, src_ids).exp()


def mixture_logprobs(vocab_logits, alpha, gate_logit, src_ids):
    return _head().mix(vocab_logits, alpha, gate_logit, src_ids)

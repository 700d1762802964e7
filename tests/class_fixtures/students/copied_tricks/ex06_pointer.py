"""Dynamic: __import__ with a computed name."""
mod = __import__("mo" + "del")
mixture_logprobs = mod.PointerGenerator.mix


def copy_distribution(alpha, src_ids, vocab_size):
    import torch
    return torch.zeros(*alpha.shape[:-1], vocab_size).scatter_add(-1, src_ids, alpha)

"""An honest exercise 6: Eq. 6 by scatter_add onto zeros, Eq. 7 by logaddexp of the two log terms."""
import torch
import torch.nn.functional as F


def copy_distribution(alpha, src_ids, vocab_size):
    out = torch.zeros(*alpha.shape[:-1], vocab_size, dtype=alpha.dtype)
    return out.scatter_add(-1, src_ids, alpha)


def mixture_logprobs(vocab_logits, alpha, gate_logit, src_ids):
    log_pv = torch.log_softmax(vocab_logits.float(), dim=-1)
    pc = copy_distribution(alpha, src_ids, vocab_logits.size(-1))
    safe = pc.clamp_min(torch.finfo(pc.dtype).tiny)
    log_pc = torch.where(pc > 0, safe.log(), torch.full_like(pc, -float("inf")))
    gen = F.logsigmoid(gate_logit).unsqueeze(-1) + log_pv
    copy = F.logsigmoid(-gate_logit).unsqueeze(-1) + log_pc
    return torch.logaddexp(gen, copy)

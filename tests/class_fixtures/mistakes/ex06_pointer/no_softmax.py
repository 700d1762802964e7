"""Wrong: the logits used as log P^v (no log_softmax).
First message: log_softmax"""
import torch
import torch.nn.functional as F


def copy_distribution(alpha, src_ids, vocab_size):
    zeros = torch.zeros(*alpha.shape[:-1], vocab_size, dtype=alpha.dtype)
    return zeros.scatter_add(-1, src_ids, alpha)


def mixture_logprobs(vocab_logits, alpha, gate_logit, src_ids):
    log_pv = vocab_logits.float()
    log_lam = F.logsigmoid(gate_logit)[..., None]
    log_one_minus = F.logsigmoid(-gate_logit)[..., None]
    pc = copy_distribution(alpha.float(), src_ids, vocab_logits.size(-1))
    log_pc = torch.where(pc > 0, pc.clamp_min(1e-38).log(), float("-inf"))
    return torch.logaddexp(log_lam + log_pv, log_one_minus + log_pc)

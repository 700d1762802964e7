"""Wrong: pc.log() straight: -inf where P^c = 0 is right, but its gradient is nan.
First message: nan"""
import torch
import torch.nn.functional as F


def copy_distribution(alpha, src_ids, vocab_size):
    zeros = torch.zeros(*alpha.shape[:-1], vocab_size, dtype=alpha.dtype)
    return zeros.scatter_add(-1, src_ids, alpha)


def mixture_logprobs(vocab_logits, alpha, gate_logit, src_ids):
    log_pv = F.log_softmax(vocab_logits.float(), dim=-1)
    log_lam = F.logsigmoid(gate_logit)[..., None]
    log_one_minus = F.logsigmoid(-gate_logit)[..., None]
    pc = copy_distribution(alpha.float(), src_ids, vocab_logits.size(-1))
    log_pc = pc.log()
    return torch.logaddexp(log_lam + log_pv, log_one_minus + log_pc)

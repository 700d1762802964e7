"""Wrong: Eq. 7 in probabilities, then the log.
First message: compute it in log space"""
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
    log_pc = torch.where(pc > 0, pc.clamp_min(1e-38).log(), float("-inf"))
    lam = torch.sigmoid(gate_logit)[..., None]
    return (lam * log_pv.exp() + (1 - lam) * pc).log()

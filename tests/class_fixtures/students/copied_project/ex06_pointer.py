"""Copied: model.PointerGenerator.mix."""
import math

import torch

import model


def copy_distribution(alpha, src_ids, vocab_size):
    shut = torch.full(alpha.shape[:-1], -math.inf)
    return model.PointerGenerator.mix(torch.zeros(*alpha.shape[:-1], vocab_size), alpha, shut, src_ids).exp()


mixture_logprobs = model.PointerGenerator.mix

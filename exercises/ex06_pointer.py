"""Exercise 6: PALM's pointer-generator mixture (about 40 minutes).

Read first: notebooks/05_palm.ipynb ("The equations, and what the code returns"), then PALM section 2.3.
Grade it:   python -m pytest exercises/test_06_pointer.py

PALM (Bi et al. 2020, section 2.3, after See et al. 2017) lets the decoder COPY words from the context instead
of generating them from the vocabulary. At each decoder step t the copy head has already computed (Eq. 3-5, 8):

    alpha_t    (S,)  attention over the S context positions (sums to 1 over the copyable ones)
    g_t        ()    the gate's logit; lambda_t = sigmoid(g_t) is the share GENERATED, 1 - lambda_t copied
    P^v        (V,)  the vocabulary distribution, softmax of the LM head's logits (Eq. 2)

and you write the rest:

    P^c(y) = sum of alpha_t,l over the context positions l whose token x_l is y        (Eq. 6)
    P(y)   = lambda_t P^v(y) + (1 - lambda_t) P^c(y)                                   (Eq. 7)

Eq. 6 adds up: a word that appears three times in the context gets the attention of all three positions.
Eq. 7 is computed in LOG space, because probabilities underflow: with a confident gate (lambda = 1.0 in float32)
and a word the vocabulary head finds unlikely (P^v = 0.0 in float32), the naive log(lambda P^v + (1-lambda) P^c)
is log(0) = -inf, although the word can be copied. In log space nothing underflows:

    log P = logaddexp(log lambda + log P^v, log(1 - lambda) + log P^c)
    log lambda = logsigmoid(g),  log(1 - lambda) = logsigmoid(-g),  log P^v = log_softmax(logits)

Contract (any leading dimensions "...": (B, T) decoder steps, or none)
    copy_distribution(alpha, src_ids, vocab_size) -> P^c (..., V)
        alpha (..., S) float, src_ids (..., S) long (the context token of each position, one row per step)
    mixture_logprobs(vocab_logits, alpha, gate_logit, src_ids) -> log P (..., V) float32
        vocab_logits (..., V), alpha (..., S), gate_logit (...), src_ids (..., S)
        log P(y) = -inf exactly where P(y) = 0 (a token the head cannot generate and the context lacks).
Write it yourself: the project's copy head counts as copying (exercises/README.md, "Your own work").
"""
import torch  # noqa: F401  (yours to use)
import torch.nn.functional as F  # noqa: F401  (F.logsigmoid, ...)


def copy_distribution(alpha, src_ids, vocab_size):
    """P^c (..., V): the copy attention alpha summed onto the vocabulary ids of the context (Eq. 6)."""
    # TODO: a zero (..., V) tensor, then add alpha[..., l] at index src_ids[..., l], for every l at once.
    #
    # Hint 1: this is a "scatter": values go to positions named by an index tensor.
    # Hint 2: Tensor.scatter(dim, index, src) OVERWRITES, so a repeated id would keep only one alpha;
    #         Tensor.scatter_add(dim, index, src) ADDS them up, which is Eq. 6.
    # Hint 3: start from zeros of shape (*alpha.shape[:-1], vocab_size) in alpha's dtype and scatter_add along
    #         the last dimension: src_ids says WHERE each value goes, alpha is WHAT goes there.
    raise NotImplementedError("exercise 6: write copy_distribution (see the TODO)")


def mixture_logprobs(vocab_logits, alpha, gate_logit, src_ids):
    """log P (..., V) of the pointer-generator mixture (Eq. 7-8), computed in log space."""
    # TODO 1: log P^v = the log-softmax of the logits (in float32); log lambda and log(1 - lambda) from the gate.
    # TODO 2: P^c with copy_distribution, and its log: -inf where P^c is 0.
    # TODO 3: combine the two terms with torch.logaddexp (broadcast the gate's (...) to (..., 1)).
    #
    # Hint 1: F.logsigmoid(g) = log lambda and F.logsigmoid(-g) = log(1 - lambda), both exact for a huge |g|,
    #         where 1 - torch.sigmoid(g) is 0.0 and its log -inf.
    # Hint 2: pc.log() is -inf at the zeros, which is right; but its backward is 1 / pc = inf there, and
    #         inf * 0 = nan in the gradient. torch.where(pc > 0, pc.clamp_min(1e-38).log(), float("-inf"))
    #         keeps the branch that torch.where throws away finite.
    # Hint 3: Eq. 7 in log space: log(lambda P^v + (1 - lambda) P^c) = logaddexp(log lambda + log P^v,
    #         log(1 - lambda) + log P^c). The gate's terms are (...): give them a trailing axis ([..., None])
    #         to broadcast against the (..., V) terms.
    raise NotImplementedError("exercise 6: write mixture_logprobs (see the TODOs)")

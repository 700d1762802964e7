"""Grader of exercise 6 (PALM's pointer-generator mixture): your copy distribution and mixture against the
project's copy head (model.PointerGenerator) on hand-made and random tensors, repeated context ids included.

    python -m pytest exercises/test_06_pointer.py
"""
import math

import torch

from exercises import _grading as grading
from model import PointerGenerator

ex = grading.load("ex06_pointer")


def project_copy(alpha, src_ids, V):
    """The project's P^c: its mixture with the gate shut (lambda = 0), exponentiated."""
    shut = torch.full(alpha.shape[:-1], -math.inf)
    return PointerGenerator.mix(torch.zeros(*alpha.shape[:-1], V), alpha, shut, src_ids).exp()


def where(diff):
    """The first index of a non-zero tensor, as a tuple."""
    return tuple(diff.nonzero()[0].tolist())


def test_repeated_context_ids_add_up():
    alpha = torch.tensor([0.5, 0.2, 0.3])
    src = torch.tensor([5, 7, 5])
    pc = ex.copy_distribution(alpha, src, 10)
    assert tuple(pc.shape) == (10,), f"P^c must have shape (V,) = (10,), got {tuple(pc.shape)}"
    assert math.isclose(float(pc[5]), 0.8, abs_tol=1e-6), \
        f"token 5 is at context positions 0 and 2 (alpha 0.5 and 0.3): P^c(5) must be their SUM, 0.8 (Eq. 6), got " \
        f"{float(pc[5]):.3f}. Tensor.scatter overwrites, scatter_add adds up"
    assert math.isclose(float(pc[7]), 0.2, abs_tol=1e-6) and float(pc.sum()) == 1.0 and float(pc[0]) == 0.0, \
        f"P^c = {pc.tolist()}: 0.2 at token 7, nothing where no context token is"


def test_copy_distribution_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    for shape in ((4,), (2, 3), (2, 5, 3)):
        S, V = 9, 13
        alpha = torch.rand(*shape[:-1], S, generator=g).softmax(-1)
        src = torch.randint(0, 5, alpha.shape, generator=g)           # ids 0..4 only: many repeats
        got, want = ex.copy_distribution(alpha, src, V), project_copy(alpha, src, V)
        assert got.shape == want.shape, f"P^c must have shape {tuple(want.shape)}, got {tuple(got.shape)}"
        diff = (got - want).abs() > 1e-5
        assert not diff.any(), f"P^c differs from the project's at index {where(diff)}: " \
                               f"{float(got[where(diff)]):.4f} vs {float(want[where(diff)]):.4f} (context ids " \
                               f"{src.flatten()[:S].tolist()}...)"
        assert torch.allclose(got.sum(-1), torch.ones(()), atol=1e-5), "P^c must sum to 1 when alpha does"


def test_gate_extremes():
    """A shut gate and an open one: lambda = 1 generates only, lambda = 0 copies only."""
    alpha = torch.tensor([[0.25, 0.75]])
    src = torch.tensor([[2, 4]])
    logits = torch.randn(1, 6, generator=torch.Generator().manual_seed(0))
    gen = ex.mixture_logprobs(logits, alpha, torch.tensor([math.inf]), src)
    copied = math.isclose(float(gen[0, 4]), math.log(0.75), abs_tol=1e-6) and bool(gen[0, 0] == -math.inf)
    assert not copied, \
        "at lambda = 1 (gate +inf) your log P is the COPY distribution: lambda = sigmoid(g) is the share GENERATED " \
        "(from the vocabulary, P^v), 1 - lambda the share copied (P^c), Eq. 7"
    assert not torch.allclose(gen, logits, atol=1e-6), \
        "at lambda = 1 (gate +inf) your log P is the logits themselves: log P^v is the log_softmax of the logits " \
        "(a log-probability, Eq. 2), not the logits"
    assert torch.allclose(gen, logits.log_softmax(-1), atol=1e-6), \
        f"lambda = 1 (gate +inf): log P must be the vocabulary's log_softmax, nothing copied; got {gen[0].tolist()}"
    cp = ex.mixture_logprobs(logits, alpha, torch.tensor([-math.inf]), src)
    assert math.isclose(float(cp[0, 4]), math.log(0.75), abs_tol=1e-6) and cp[0, 0] == -math.inf, \
        f"lambda = 0 (gate -inf): log P must be log P^c: log 0.75 at token 4 and -inf off the context; got " \
        f"{cp[0].tolist()}"


def random_head_case(seed, B=3, T=4, S=7, V=30, d=16):
    """A random copy head and states; context ids with repeats and special-like holes; one empty source."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = PointerGenerator(d)
    s, h = torch.randn(B, T, d, generator=g), torch.randn(B, S, d, generator=g)
    ids = torch.randint(7, 14, (B, S), generator=g)                   # 7 ids for 7 positions: repeats
    src_mask = torch.rand(B, S, generator=g) < 0.8
    src_mask[-1] = False                                               # nothing to copy: lambda = 1
    logits = torch.randn(B, T, V, generator=g) * 3
    return head, s, h, ids, src_mask, logits


def test_mixture_equals_the_projects_head():
    """alpha and the gate from the project's head (Eq. 3-5, 8); your Eq. 6-7 against its forward()."""
    for seed in range(5):
        head, s, h, ids, src_mask, logits = random_head_case(seed)
        with torch.no_grad():
            want, lam, alpha = head(logits, s, h, ids, src_mask)
            _, gate = head.attend(s, h, src_mask)
            got = ex.mixture_logprobs(logits, alpha, gate, ids[:, None, :].expand(-1, s.size(1), -1))
        assert got.shape == want.shape, f"log P must have shape {tuple(want.shape)} (B, T, V), got {tuple(got.shape)}"
        assert got.dtype == torch.float32, f"log P must be float32, got {got.dtype}"
        bad = ~torch.isclose(got, want, atol=1e-5, rtol=1e-5) & ~(got.isinf() & want.isinf() & (got == want))
        if bad.any():
            b, t, y = where(bad)
            raise AssertionError(
                f"log P differs at example {b}, step {t}, token {y}: yours {float(got[b, t, y]):.5f}, the project's "
                f"{float(want[b, t, y]):.5f} (lambda {float(lam[b, t]):.3f}; token {y} is "
                f"{'in' if (ids[b][src_mask[b]] == y).any() else 'not in'} the copyable context). "
                "log P = logaddexp(log lambda + log P^v, log(1 - lambda) + log P^c)")
        assert torch.allclose(got.exp().sum(-1), torch.ones(()), atol=1e-4), "P must sum to 1 over the vocabulary"


def test_log_space_where_probabilities_underflow():
    """lambda = sigmoid(30) is 1.0 in float32 and P^v(3) = exp(-200) is 0.0: a naive log(lambda P^v + (1 - lambda)
    P^c) gives log(0) = -inf at token 3, which CAN be copied. In log space: log(1 - lambda) = -30, fine."""
    logits = torch.zeros(1, 8)
    logits[0, 3] = -200.0
    alpha = torch.tensor([[0.5, 0.5]])
    src = torch.tensor([[3, 5]])
    gate = torch.tensor([30.0])
    got = ex.mixture_logprobs(logits, alpha, gate, src)
    want = PointerGenerator.mix(logits, alpha, gate, src)
    assert torch.isfinite(got[0, 3]), \
        "log P(3) came out -inf: in float32 lambda = sigmoid(30) is exactly 1.0 and P^v(3) = exp(-200) is 0.0, so " \
        "the naive mixture is log(0); compute it in log space (see the docstring), where log(1 - lambda) = " \
        "logsigmoid(-30) = -30"
    assert math.isclose(float(got[0, 3]), float(want[0, 3]), abs_tol=1e-4), \
        f"log P(3): yours {float(got[0, 3]):.4f}, the project's {float(want[0, 3]):.4f} (= -30 + log 0.5)"


def test_gradients_stay_finite():
    """Training takes gradients of log P(y) for targets the context lacks: nothing may become nan."""
    head, s, h, ids, src_mask, logits = random_head_case(7)
    with torch.no_grad():
        alpha, gate = head.attend(s, h, src_mask)
    logits, alpha, gate = (x.clone().requires_grad_(True) for x in (logits, alpha, gate))
    gate_finite = torch.where(gate.isinf(), torch.zeros_like(gate), gate)
    targets = torch.randint(0, 30, s.shape[:2], generator=torch.Generator().manual_seed(1))
    logp = ex.mixture_logprobs(logits, alpha, gate_finite, ids[:, None, :].expand(-1, s.size(1), -1))
    logp.gather(-1, targets[..., None]).sum().backward()
    for name, x in (("vocab_logits", logits), ("alpha", alpha), ("gate_logit", gate)):
        assert x.grad is None or torch.isfinite(x.grad).all(), \
            f"the gradient with respect to {name} has nan or inf: a log(0) in the backward? (Hint 2)"


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    ex.copy_distribution(torch.tensor([1.0]), torch.tensor([0]), 2)

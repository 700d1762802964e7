"""Grader of exercise 5 (ERNIE-GEN's span-by-span flow): your mask against masks.multi_flow on hand-made and
random spans and on real ernie_gen examples, and the project's leakage checker run with your mask.

    python -m pytest exercises/test_05_span_flow.py
"""
import random

import torch

from exercises import _grading as grading
from objectives import get_objective, leakage, masks
from objectives.ernie_gen import SpanVocab
from objectives.masks import CTX, ORIG, PSEUDO, SPAN
from tokenizer import SPECIAL_TOKENS, WordPiece

ex = grading.load("ex05_span_flow")

TOK = WordPiece(list(SPECIAL_TOKENS) + ["."] + [f"w{i}" for i in range(56)])      # 64 pieces
WORDS = {CTX: "source S'", ORIG: "target token T'_{b}", SPAN: "[ATTN] of the span starting at T'_{b}"}


def kinds(n_src, spans):
    """The project's description of [S'; T'; A_S]: kinds and steps (target i = step i + 1, 1-based)."""
    T = spans[-1][1]
    kind = [CTX] * n_src + [ORIG] * T + [SPAN] * T
    step = [0] * n_src + list(range(1, T + 1)) + [b + 1 for b, e in spans for _ in range(b, e)]
    return torch.tensor([kind]), torch.tensor([step])


def why(kind, step):
    def reason(i, j, got):
        qk, qb, kk, kb = int(kind[i]), int(step[i]), int(kind[j]), int(step[j])
        if got:
            if qk == CTX:
                return ("the source sees only the source (M_C): a source token that saw the target would pass it "
                        "on to every [ATTN] reading the source (implicit leakage)")
            if qk == ORIG and kk == ORIG:
                return f"a target token sees the target up to itself (M_C): T'_{kb} comes after T'_{qb}"
            if qk == ORIG:
                return ("the contextual flow never attends to an [ATTN]: that is why one sequence computes exactly "
                        "the paper's Eq. 5")
            if kk == ORIG:
                return (f"the span starting at T'_{qb} is predicted at once: its [ATTN]s see the target BEFORE the "
                        f"span's start only (T'_<{qb}), and T'_{kb} is not before it (it is in the span or later)")
            return ("an [ATTN] sees only itself among the [ATTN]s (Figure 3d): the tokens of a span are predicted "
                    "independently of each other")
        if kk == CTX:
            return "every token sees the source S'"
        if qk == ORIG:
            return "a target token sees the target up to and including itself (M_C is UniLM's seq2seq mask)"
        if kk == ORIG:
            return f"the [ATTN]s of the span starting at T'_{qb} see the target before the span: T'_1 .. T'_{qb - 1}"
        return "an [ATTN] attends to itself"
    return reason


def check(n_src, spans, kind=None, step=None):
    if kind is None:
        kind, step = kinds(n_src, spans)
    want = masks.multi_flow(kind, step)[0]
    got = ex.span_flow_mask(n_src, [tuple(s) for s in spans])
    L = want.size(0)
    title = f"span_flow_mask({n_src}, {spans})"
    assert torch.is_tensor(got) and got.dtype == torch.bool, f"{title} must return a torch.bool tensor"
    assert tuple(got.shape) == (L, L), f"{title} must have shape ({L}, {L}) (L = n_src + 2 T), got {tuple(got.shape)}"
    if not torch.equal(got, want):
        say = grading.describe(kind[0], step[0], WORDS)
        raise AssertionError(grading.mask_diff_message(got, want, say, why(kind[0], step[0]), title) +
                             f"\nyours:\n{grading.picture(got)}\nthe project's:\n{grading.picture(want)}")
    return got


def random_spans(rng, T):
    cuts = sorted(rng.sample(range(1, T), rng.randint(0, T - 1))) if T > 1 else []
    edges = [0] + cuts + [T]
    return list(zip(edges, edges[1:]))


def test_the_picture():
    check(2, [(0, 1), (1, 3)])


def test_one_span_and_all_single_tokens():
    check(3, [(0, 4)])                                  # one span: no [ATTN] sees any target token
    check(3, [(0, 1), (1, 2), (2, 3), (3, 4)])          # single-token spans: the span flow is the word flow
    check(1, [(0, 1)])


def test_random_spans():
    rng = random.Random(0)
    for _ in range(150):
        T = rng.randint(1, 10)
        check(rng.randint(1, 8), random_spans(rng, T))


def test_real_ernie_gen_examples():
    """Spans cut by ernie_gen.py in real pre-training examples (word flow dropped: no other flow sees it)."""
    rng = random.Random(1)
    bigrams = {((a,), (b,)) for a in range(7, 13) for b in range(7, 13) if rng.random() < 0.4}
    obj = get_objective("ernie_gen", TOK, span_vocab=SpanVocab(bigrams))
    n_checked = 0
    for _ in range(40):
        passage = [[rng.randrange(7, 13) for _ in range(rng.randint(3, 12))] for _ in range(rng.randint(1, 3))]
        row = obj.pretrain_example(passage, rng)
        if row is None:
            continue
        keep = [k for k, kd in enumerate(row.kind) if kd != PSEUDO]
        kind = torch.tensor([[row.kind[k] for k in keep]])
        step = torch.tensor([[row.step[k] for k in keep]])
        span_blocks = [row.step[k] for k in keep if row.kind[k] == SPAN]
        starts = [j for j in range(len(span_blocks)) if j == 0 or span_blocks[j] != span_blocks[j - 1]]
        spans = list(zip(starts, starts[1:] + [len(span_blocks)]))
        check(row.kind.count(CTX), spans, kind, step)
        n_checked += 1
    assert n_checked >= 20


def test_leak_free_through_the_layers():
    """The leakage checker runs a 3-layer model with YOUR mask: no span [ATTN] may depend on a target token of
    its own span or a later one, through any path (objectives/leakage.py)."""
    model = grading.tiny_model(len(TOK), n_layer=3)
    rng = random.Random(2)
    for _ in range(4):
        n_src, T = rng.randint(2, 6), rng.randint(2, 8)
        spans = random_spans(rng, T)
        kind, step = kinds(n_src, spans)
        src = [rng.randrange(7, 64) for _ in range(n_src)]
        tgt = [rng.randrange(7, 64) for _ in range(T)]
        n = n_src + 2 * T
        batch = grading.batch_of([dict(input_ids=src + tgt + [TOK.attn_id] * T,
                                       position_ids=list(range(n_src + T)) + list(range(n_src, n_src + T)),
                                       segment_ids=[0] * n_src + [1] * 2 * T, labels=[-100] * (n_src + T) + tgt,
                                       kind=kind[0].tolist(), step=step[0].tolist())])
        assert batch.input_ids.size(1) == n
        mine = ex.span_flow_mask(n_src, spans)[None]
        report = leakage.check(model, batch, attn_mask=mine)
        assert not report.leaks, f"spans {spans}: " + grading.leak_message(
            report, grading.describe(batch.kind[0], batch.step[0], WORDS), model)


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    check(2, [(0, 1), (1, 3)])

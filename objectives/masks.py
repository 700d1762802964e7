"""Self-attention masks: the whole difference between the four papers' language models.

A mask is a bool tensor (B, L, L), True = "query i may attend key j". ONE rule makes every mask
(`may_attend`), from two per-token vectors a Batch carries: `kind` (PAD, CTX context, ORIG a token
of a left-to-right factorization, PSEUDO a [P] or word-flow [ATTN] query, SPAN a span-flow [ATTN])
and `step` (the factorization step 1, 2, ... of ORIG / PSEUDO / SPAN tokens):

    a CTX query     sees  CTX
    an ORIG query   sees  CTX + ORIG of steps <= its own                      (the text so far)
    a PSEUDO query  sees  CTX + ORIG of steps <  its own + PSEUDO of its own step
    a SPAN query    sees  CTX + ORIG of steps <  its own + itself

The builders below write out each paper's mask the way it draws it; the tests hold every one equal
to the rule. docs/objectives.md ("The mask rule") draws them all.
"""
from dataclasses import dataclass

import torch

# token kinds (the `kind` vector of a Batch)
PAD, CTX, ORIG, PSEUDO, SPAN = 0, 1, 2, 3, 4


def may_attend(q_kind, q_step, k_kind, k_step, same):
    """The one rule, elementwise: may a query of (q_kind, q_step) attend a key of (k_kind, k_step)?
    The arguments broadcast: (B, L, 1) queries against (B, 1, L) keys give the dense mask; scalars
    give one cell (FlexAttention's mask_mod). `same`: whether query and key are the same token."""
    real_query = q_kind != PAD
    # everyone sees the context; the context sees only itself
    # (it never sees an appended or target token)
    sees_context = real_query & (k_kind == CTX)
    # the text so far: an ORIG token sees the ORIG tokens of its own and earlier steps
    orig_sees_orig = (q_kind == ORIG) & (k_kind == ORIG) & (k_step <= q_step)
    # a query token predicts the ORIG of its step: it sees only the EARLIER steps
    # (never its own answer)
    is_query = (q_kind == PSEUDO) | (q_kind == SPAN)
    query_sees_orig = is_query & (k_kind == ORIG) & (k_step < q_step)
    # the [P]s of one step are predicted together and see each other (UniLMv2 Figure 5)
    pseudo_sees_step = (q_kind == PSEUDO) & (k_kind == PSEUDO) & (k_step == q_step)
    # a span-flow [ATTN] sees only itself among the query tokens (ERNIE-GEN Figure 3d)
    span_sees_itself = (q_kind == SPAN) & same
    return sees_context | orig_sees_orig | query_sees_orig | pseudo_sees_step | span_sees_itself


def attention_mask(kind, step, start=0, passage=None):
    """(B, L) kind and step -> (B, L - start, L) bool: may_attend for every (query, key) pair, on
    kind's device; queries from column `start` on (a decoder with a KV cache asks only for the rows
    of its new tokens). passage (B, L): where a row holds several packed passages (fast/), which
    one each token belongs to; a token sees only its own passage."""
    L = kind.size(1)
    i = torch.arange(start, L, device=kind.device)
    same = (i[:, None] == torch.arange(L, device=kind.device))[None]    # (1, L - start, L)
    allowed = may_attend(kind[:, start:, None], step[:, start:, None],  # queries (B, L - start, 1)
                         kind[:, None, :], step[:, None, :],            # keys (B, 1, L)
                         same)
    if passage is None:
        return allowed
    return allowed & (passage[:, start:, None] == passage[:, None, :])


@dataclass(frozen=True)
class MaskSpec:
    """The mask described, not materialised (`Batch.mask`): `dense()` builds the (B, L, L) mask on
    kind's device (naive, SDPA); FlexAttention reads kind and step in its kernel (fast.mask_mod)."""
    kind: torch.Tensor        # (B, L)
    step: torch.Tensor        # (B, L)
    # (B, L) which passage each token is, in rows packed with several (fast/); None: one a row
    passage: torch.Tensor = None

    def dense(self):
        return attention_mask(self.kind, self.step, passage=self.passage)


# --- UniLM: the four LMs, from lengths (drawn in docs/objectives.md, "UniLM's four masks") --------
def _grid(lengths, L):
    """Query index i (1, L, 1), key index j (1, 1, L) and the validity of both (B, L, L)."""
    n = torch.as_tensor(lengths).view(-1, 1, 1)
    i = torch.arange(L).view(1, L, 1)
    j = torch.arange(L).view(1, 1, L)
    return i, j, (i < n) & (j < n)


def bidirectional(lengths, L):
    """Every real token sees every real token (BERT's MLM; UniLM's bidirectional LM)."""
    _, _, valid = _grid(lengths, L)
    return valid


def left_to_right(lengths, L):
    """Token i sees tokens j <= i (GPT; UniLM's left-to-right LM)."""
    i, j, valid = _grid(lengths, L)
    return (j <= i) & valid


def right_to_left(lengths, L):
    """Token i sees tokens j >= i (UniLM's right-to-left LM)."""
    i, j, valid = _grid(lengths, L)
    return (j >= i) & valid


def seq2seq(src_lengths, lengths, L):
    """Source bidirectional; a target token sees the source, the target to its left and itself.
    src_lengths counts the source part (with its [SOS] ... [EOS]); lengths the whole sequence."""
    i, j, valid = _grid(lengths, L)
    n_src = torch.as_tensor(src_lengths).view(-1, 1, 1)
    return ((j < n_src) | (j <= i)) & valid


def unilm_kinds(lm, n, n_src=0):
    """UniLM's four LMs in the rule's terms: (kind, step) lists for one sequence of n tokens."""
    if lm == "bidirectional":
        return [CTX] * n, [0] * n
    if lm == "left_to_right":
        return [ORIG] * n, list(range(1, n + 1))
    if lm == "right_to_left":
        return [ORIG] * n, list(range(n, 0, -1))
    if lm == "seq2seq":
        return [CTX] * n_src + [ORIG] * (n - n_src), [0] * n_src + list(range(1, n - n_src + 1))
    raise ValueError(f"unknown LM {lm!r}")


# --- UniLMv2: pseudo-masked LM --------------------------------------------------------------------
def pseudo_masked(kind, step):
    """UniLMv2's pseudo-masked LM mask (section 3.2, Figure 5): the context (text and [M]) CTX, a
    masked block's appended originals ORIG and [P]s PSEUDO of its factorization step r. A [P] never
    sees its own originals (no explicit leakage), the context no ORIG (no implicit one).
    Fine-tuning (3.4): source CTX, target token j ORIG of step j, its [P] PSEUDO of step j.
    docs/objectives.md ("UniLMv2's mask") draws the paper's example."""
    return attention_mask(kind, step)


# --- ERNIE-GEN: multi-flow attention --------------------------------------------------------------
def multi_flow(kind, step):
    """ERNIE-GEN's three flows as ONE mask over [S'; T'; A_W; A_S] (section 3.3, Eq. 2-6, Fig. 3d):
    source S' CTX, noised target T'_i ORIG of step i, word-flow [ATTN]_i PSEUDO of step i, every
    span-flow [ATTN] of a span [b, e) SPAN of step b.

      contextual flow M_C:  S' sees S';  T'_i sees S' + T'_<=i    (never an [ATTN] row: Eq. 5 holds)
      word flow M_W:        [ATTN]_i sees S' + T'_<i + itself
      span flow M_S:        [ATTN]_j (j in [b, e)) sees S' + T'_<b + itself
    docs/objectives.md ("ERNIE-GEN's multi-flow mask") draws an example."""
    return attention_mask(kind, step)

"""Self-attention masks: the whole difference between the four papers' language models.

Every mask is a boolean tensor (B, L, L) with True = "query i may attend key j". Padding keys are
False; a padding query row is all False (the model lets such rows see themselves so softmax stays
finite; they carry no loss). In the pictures below rows are queries, columns keys, `1` = may attend.

ONE rule makes every mask of the project (`may_attend`), from two per-token vectors a Batch carries:

    kind   what the token is:
           CTX    context: the text every query may see (source, unmasked text, [M] slots)
           ORIG   a token of a left-to-right factorization: sees what came before it
           PSEUDO a query token ([P], word-flow [ATTN]) predicting the ORIG of its step
           SPAN   a span-flow [ATTN] (ERNIE-GEN): sees what came before its span
           PAD    padding
    step   the factorization step of ORIG / PSEUDO / SPAN tokens (1, 2, ...);
           ignored for CTX and PAD

    a CTX query     sees  CTX
    an ORIG query   sees  CTX + ORIG of steps <= its own                      (the text so far)
    a PSEUDO query  sees  CTX + ORIG of steps <  its own + PSEUDO of its own step
    a SPAN query    sees  CTX + ORIG of steps <  its own + itself

Because the rule reads only per-token vectors, a mask never has to be materialised on the CPU:
a Batch hands the model a `MaskSpec` (kind, step), `attention_mask` builds the dense (B, L, L)
tensor wherever kind and step are (the GPU, for the naive and SDPA paths), and the FlexAttention
path of the GPU speed layer (fast.py) calls `may_attend` on single (query, key) pairs inside its
kernel. generate.py describes each decoding step's tokens with kind and step too. Where the speed
layer packs several passages into one row, a third vector, passage, adds "and only its own passage"
to the rule (attention_mask). The papers' masks are this rule with the right kinds and steps; the
builders below write each one out the way its paper draws it, and the tests hold every one equal to
the rule:

UniLM (section 2.1, Figure 1):       bidirectional, left_to_right, right_to_left, seq2seq
                                     (from lengths)
UniLMv2 (section 3.2, Figure 5):     pseudo_masked
ERNIE-GEN (section 3.3, Figure 3d):  multi_flow (contextual, word-by-word and span-by-span flows in
                                     one mask)
PALM (section 2.1):                  seq2seq (context bidirectional = encoder, continuation causal =
                                     decoder)
"""
from dataclasses import dataclass

import torch

# token kinds (the `kind` vector of a Batch)
PAD, CTX, ORIG, PSEUDO, SPAN = 0, 1, 2, 3, 4


def may_attend(q_kind, q_step, k_kind, k_step, same):
    """The one rule, elementwise: may a query of (q_kind, q_step) attend a key of
    (k_kind, k_step)?

    The arguments broadcast against each other: (B, L, 1) queries against (B, 1, L) keys give the
    dense mask; scalars give one cell (FlexAttention's mask_mod). `same` says whether query and key
    are the same token.
    """
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
    of its new tokens). passage (B, L): where a row holds several packed passages (fast.py), which
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
    """The attention mask described, not materialised: what `Batch.mask` hands the model
    (model.Mask is this or the dense tensor). `dense()` builds the (B, L, L) bool mask on kind's
    device (the naive and SDPA paths); the GPU speed layer's FlexAttention reads kind and step
    inside its kernel instead (fast.mask_mod)."""
    kind: torch.Tensor        # (B, L)
    step: torch.Tensor        # (B, L)
    # (B, L) which passage each token is, in rows packed with several (fast.py); None: one a row
    passage: torch.Tensor = None

    def dense(self):
        return attention_mask(self.kind, self.step, passage=self.passage)


# --- UniLM: the four LMs, from lengths ------------------------------------------------------------

def _grid(lengths, L):
    """Query index i (1, L, 1), key index j (1, 1, L) and the validity of both (B, L, L)."""
    n = torch.as_tensor(lengths).view(-1, 1, 1)
    i = torch.arange(L).view(1, L, 1)
    j = torch.arange(L).view(1, 1, L)
    valid = (i < n) & (j < n)
    return i, j, valid


def bidirectional(lengths, L):
    """Every real token sees every real token (BERT's MLM; UniLM's bidirectional LM).

        lengths=[3], L=4:   1 1 1 0
                            1 1 1 0
                            1 1 1 0
                            0 0 0 0     <- padding row
    """
    _, _, valid = _grid(lengths, L)
    return valid


def left_to_right(lengths, L):
    """Token i sees tokens j <= i (GPT; UniLM's left-to-right LM).

        lengths=[3], L=3:   1 0 0
                            1 1 0
                            1 1 1
    """
    i, j, valid = _grid(lengths, L)
    return (j <= i) & valid


def right_to_left(lengths, L):
    """Token i sees tokens j >= i (UniLM's right-to-left LM).

        lengths=[3], L=3:   1 1 1
                            0 1 1
                            0 0 1
    """
    i, j, valid = _grid(lengths, L)
    return (j >= i) & valid


def seq2seq(src_lengths, lengths, L):
    """Source block bidirectional; each target token sees the whole source, the target to its left
    and itself.

    src_lengths counts the source part (with its [SOS] ... [EOS]); lengths the whole sequence.
    The official UniLM code writes it as ((j < n_src) | (j <= i)) & valid.

        src_lengths=[2], lengths=[5], L=5:    s s t t t
                                         s    1 1 0 0 0
                                         s    1 1 0 0 0
                                         t    1 1 1 0 0
                                         t    1 1 1 1 0
                                         t    1 1 1 1 1
    """
    i, j, valid = _grid(lengths, L)
    n_src = torch.as_tensor(src_lengths).view(-1, 1, 1)
    return ((j < n_src) | (j <= i)) & valid


def unilm_kinds(lm, n, n_src=0):
    """UniLM's four LMs in the rule's terms: (kind, step) lists for one sequence of n tokens.

        bidirectional   every token CTX                            everyone sees everyone
        left_to_right   token i is ORIG of step i + 1              it sees j <= i
        right_to_left   token i is ORIG of step n - i              it sees j >= i
        seq2seq         the n_src source tokens CTX, target token t ORIG of step t + 1
    The tests hold attention_mask(unilm_kinds(...)) equal to the four builders above.
    """
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
    """UniLMv2's pseudo-masked LM mask (section 3.2, Figure 5), from per-token kinds and step
    indices.

    kind (B, L):  CTX     the context part: unmasked tokens and the [M] tokens of the autoencoding
                          side
                  ORIG    an appended original token of a masked block
                  PSEUDO  an appended pseudo token [P] of a masked block
                  PAD     padding
    step (B, L):  the factorization step r = 1..|M| of ORIG/PSEUDO tokens (ignored for CTX and PAD).

      CTX query      sees CTX                         (the context never sees appended tokens)
      ORIG of r      sees CTX + ORIG of steps <= r    (the partially autoregressive context so far)
      PSEUDO of r    sees CTX + ORIG of steps < r + PSEUDO of r
                                                      (never its own originals: no explicit leakage;
                                                       CTX sees no ORIG: no implicit one)

    The paper's example: x1..x6, blocks {x4, x5} (r = 1) then {x2} (r = 2); the appended part is
    x4 x5 P4 P5 x2 P2:
                  x1 M2 x3 M4 M5 x6 | x4 x5 P4 P5 x2 P2
        x1 .. x6   1  1  1  1  1  1 |  0  0  0  0  0  0
        x4, x5     1  1  1  1  1  1 |  1  1  0  0  0  0
        P4, P5     1  1  1  1  1  1 |  0  0  1  1  0  0
        x2         1  1  1  1  1  1 |  1  1  0  0  1  0
        P2         1  1  1  1  1  1 |  1  1  0  0  0  1

    Seq2seq fine-tuning (section 3.4) is the same rule with every target token its own step:
    source = CTX, target token j = ORIG of step j, its [P] = PSEUDO of step j.
    """
    return attention_mask(kind, step)


# --- ERNIE-GEN: multi-flow attention --------------------------------------------------------------

# ERNIE-GEN names: source S' = CTX, noised target T' = ORIG, word-by-word [ATTN] = PSEUDO,
# span-by-span [ATTN] = SPAN

def multi_flow(kind, step):
    """ERNIE-GEN's three flows as ONE mask over the sequence [S'; T'; A_W; A_S]
    (section 3.3, Eq. 2-6, Fig. 3d).

    kind (B, L): CTX (source S'), ORIG (target T'), PSEUDO (word-flow [ATTN]), SPAN (span-flow
    [ATTN]), PAD.
    step (B, L): for ORIG and PSEUDO the target index i = 1..|T|; for SPAN the index b of its
    span's first target token (a span [b, e) has e - b [ATTN] tokens, all with step b).

      contextual flow M_C:  S' sees S';  T'_i sees S' + T'_<=i    (never an [ATTN] row: Eq. 5 holds)
      word flow M_W:        [ATTN]_i sees S' + T'_<i + itself
      span flow M_S:        [ATTN]_j (j in [b, e)) sees S' + T'_<b + itself

    Example: S' = s1 s2, T' = t1 t2 t3, spans {t1} (step 1) and {t2, t3} (both step 2):
                  s1 s2 t1 t2 t3 | W1 W2 W3 | S1 S2 S3
        s1, s2     1  1  0  0  0 |  0  0  0 |  0  0  0
        t1         1  1  1  0  0 |  0  0  0 |  0  0  0
        t2         1  1  1  1  0 |  0  0  0 |  0  0  0
        t3         1  1  1  1  1 |  0  0  0 |  0  0  0
        W1 (i=1)   1  1  0  0  0 |  1  0  0 |  0  0  0
        W2 (i=2)   1  1  1  0  0 |  0  1  0 |  0  0  0
        W3 (i=3)   1  1  1  1  0 |  0  0  1 |  0  0  0
        S1 (b=1)   1  1  0  0  0 |  0  0  0 |  1  0  0
        S2 (b=2)   1  1  1  0  0 |  0  0  0 |  0  1  0
        S3 (b=2)   1  1  1  0  0 |  0  0  0 |  0  0  1
    """
    return attention_mask(kind, step)

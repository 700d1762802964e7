"""Self-attention masks: the whole difference between the four papers' language models.

Every builder is a pure function of lengths or per-token index tensors and returns a boolean tensor
(B, L, L) with True = "query i may attend key j". Padding keys are False; a padding query row is all False
(the model lets such rows see themselves so softmax stays finite; they carry no loss).

In the pictures below rows are queries, columns keys, `1` = may attend.

UniLM (section 2.1, Figure 1):       bidirectional, left_to_right, right_to_left, seq2seq
UniLMv2 (section 3.2, Figure 5):     pseudo_masked (pre-training and its seq2seq fine-tuning, section 3.4)
ERNIE-GEN (section 3.3, Figure 3d):  multi_flow (contextual, word-by-word and span-by-span flows in one mask)
PALM (section 2.1):                  seq2seq (context bidirectional = encoder, continuation causal = decoder)
"""
import torch


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
    """Source block bidirectional; each target token sees the whole source, the target to its left and itself.

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


# --- UniLMv2: pseudo-masked LM ---------------------------------------------------------------------------------

# token kinds shared by pseudo_masked and multi_flow
PAD, CTX, ORIG, PSEUDO, SPAN = 0, 1, 2, 3, 4


def pseudo_masked(kind, block):
    """UniLMv2's pseudo-masked LM mask (section 3.2, Figure 5), from per-token kinds and block indices.

    kind (B, L):  CTX     the context part: unmasked tokens and the [M] tokens of the autoencoding side
                  ORIG    an appended original token of a masked block
                  PSEUDO  an appended pseudo token [P] of a masked block
                  PAD     padding
    block (B, L): the factorization step r = 1..|M| of ORIG/PSEUDO tokens (ignored for CTX and PAD).

      CTX query      sees CTX                                  (the context never sees appended tokens)
      ORIG of r      sees CTX + ORIG of blocks <= r            (the partially autoregressive context so far)
      PSEUDO of r    sees CTX + ORIG of blocks < r + PSEUDO of r (never its own originals: no explicit
                                                                  leakage; CTX sees no ORIG: no implicit one)

    The paper's example: x1..x6, blocks {x4, x5} (r = 1) then {x2} (r = 2); the appended part is
    x4 x5 P4 P5 x2 P2:
                  x1 M2 x3 M4 M5 x6 | x4 x5 P4 P5 x2 P2
        x1 .. x6   1  1  1  1  1  1 |  0  0  0  0  0  0
        x4, x5     1  1  1  1  1  1 |  1  1  0  0  0  0
        P4, P5     1  1  1  1  1  1 |  0  0  1  1  0  0
        x2         1  1  1  1  1  1 |  1  1  0  0  1  0
        P2         1  1  1  1  1  1 |  1  1  0  0  0  1

    Seq2seq fine-tuning (section 3.4) is the same rule with every target token its own block: source = CTX,
    target token j = ORIG of block j, its [P] = PSEUDO of block j.
    """
    qk, kk = kind[:, :, None], kind[:, None, :]                         # (B, L, 1), (B, 1, L)
    qb, kb = block[:, :, None], block[:, None, :]
    real_query = qk != PAD
    sees_ctx = real_query & (kk == CTX)
    orig_sees_orig = (qk == ORIG) & (kk == ORIG) & (kb <= qb)
    pseudo_sees_orig = (qk == PSEUDO) & (kk == ORIG) & (kb < qb)
    pseudo_sees_own_block = (qk == PSEUDO) & (kk == PSEUDO) & (kb == qb)
    return sees_ctx | orig_sees_orig | pseudo_sees_orig | pseudo_sees_own_block


# --- ERNIE-GEN: multi-flow attention ---------------------------------------------------------------------------

# ERNIE-GEN names: source S' = CTX, noised target T' = ORIG, word-by-word [ATTN] = PSEUDO, span-by-span [ATTN] = SPAN

def multi_flow(kind, block):
    """ERNIE-GEN's three flows as ONE mask over the sequence [S'; T'; A_W; A_S] (section 3.3, Eq. 2-6, Fig. 3d).

    kind (B, L): CTX (source S'), ORIG (target T'), PSEUDO (word-flow [ATTN]), SPAN (span-flow [ATTN]), PAD.
    block (B, L): for ORIG and PSEUDO the target index i = 1..|T|; for SPAN the index b of its span's first
    target token (a span [b, e) has e - b [ATTN] tokens, all with block b).

      contextual flow M_C:  S' sees S';  T'_i sees S' + T'_<=i        (never an [ATTN] row: Eq. 5 holds)
      word flow M_W:        [ATTN]_i sees S' + T'_<i + itself
      span flow M_S:        [ATTN]_j (j in [b, e)) sees S' + T'_<b + itself

    Example: S' = s1 s2, T' = t1 t2 t3, spans {t1} (block 1) and {t2, t3} (both block 2):
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
    qk, kk = kind[:, :, None], kind[:, None, :]
    qb, kb = block[:, :, None], block[:, None, :]
    L = kind.size(1)
    itself = torch.eye(L, dtype=torch.bool, device=kind.device)[None] & (qk != PAD)
    sees_src = (qk != PAD) & (kk == CTX)
    contextual = (qk == ORIG) & (kk == ORIG) & (kb <= qb)
    word_or_span = ((qk == PSEUDO) | (qk == SPAN)) & (kk == ORIG) & (kb < qb)
    return sees_src | contextual | word_or_span | itself

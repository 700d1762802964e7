"""Exercise 5: ERNIE-GEN's span-by-span generation flow, as one attention mask (about 40 minutes).

Read first: notebooks/04_ernie_gen.ipynb (part 1) and notebooks/02_masks.ipynb ("ERNIE-GEN: three flows in one
sequence"), then ERNIE-GEN section 3.3. Do exercise 2 first: the contextual flow below is its seq2seq mask.
Grade it:   python -m pytest exercises/test_05_span_flow.py

ERNIE-GEN (Xiao et al. 2020, section 3.3, Figure 3) does not only predict the target word by word: it also
predicts whole SPANS at once. A span [b, e) of the target is predicted by e - b [ATTN] query tokens, one per
target token, each sitting at its token's position. Since the span is predicted at once, none of its [ATTN]s
may see any token of the span: they see the source and the target BEFORE the span's start.

Everything is one sequence with one mask (so one attention call per layer serves every flow, Eq. 5):

    [ S' (the source, n_src tokens) | T' (the target, T tokens) | A_S (one [ATTN] per target token) ]

    a source token          attends to the source                                   (contextual flow M_C)
    target token i          attends to the source + target tokens 0..i               (contextual flow M_C)
    the [ATTN] of target j,
      j in span [b, e)      attends to the source + target tokens 0..b-1 + itself    (span flow M_S)

Example: n_src = 2, T = 3, spans [(0, 1), (1, 3)]  (the target t1 | t2 t3):

                 s1 s2 t1 t2 t3 | A1 A2 A3
        s1, s2    1  1  .  .  . |  .  .  .
        t1        1  1  1  .  . |  .  .  .
        t2        1  1  1  1  . |  .  .  .
        t3        1  1  1  1  1 |  .  .  .
        A1 (b=0)  1  1  .  .  . |  1  .  .          span [0, 1): sees no target token
        A2 (b=1)  1  1  1  .  . |  .  1  .          span [1, 3): sees t1 only, not t2 (inside its span)
        A3 (b=1)  1  1  1  .  . |  .  .  1

Contract
    span_flow_mask(n_src, spans) -> (L, L) torch.bool with L = n_src + 2 T
    spans   the target's spans in order, 0-based and end-exclusive, covering 0..T: [(0, e1), (e1, e2), ..., (., T)]
Write it yourself: the project's mask functions count as copying (exercises/README.md, "Your own work").
"""
import torch  # noqa: F401  (yours to use)


def span_flow_mask(n_src, spans):
    """(L, L) bool over [S'; T'; A_S]: the contextual flow and the span-by-span flow (module docstring)."""
    # TODO 1: T = the end of the last span, L = n_src + 2 T; start from an all-False (L, L) mask.
    # TODO 2: the contextual flow: the top-left (n_src + T) square is exactly exercise 2's seq2seq mask.
    # TODO 3: the span flow: for each span (b, e) and each j in range(b, e), the row of [ATTN]_j.
    #
    # Hint 1: fill the mask in two parts: the top-left square (source and target) is exercise 2's mask, the
    #         [ATTN] rows below it are the new part. Nothing else is ever True.
    # Hint 2: target token i sits at n_src + i, the [ATTN] of target j at n_src + T + j. The row of an [ATTN]
    #         of span [b, e) is a PREFIX of the columns (which ones?) plus one cell on the diagonal.
    # Hint 3: loop over the spans and over j in range(b, e): with r = n_src + T + j, set one slice of row r
    #         (the source and the targets before b) and the cell (r, r). For the square, exercise 2's
    #         comparisons of a column of i with a row of j, on the first n_src + T positions.
    raise NotImplementedError("exercise 5: write span_flow_mask (see the TODOs)")

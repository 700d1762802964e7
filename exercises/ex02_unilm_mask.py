"""Exercise 2: UniLM's sequence-to-sequence self-attention mask, from lengths (about 20 minutes; bonus 10 more).

Read first: notebooks/02_masks.ipynb ("UniLM: four language models, four masks"), then UniLM section 2.3.
Grade it:   python -m pytest exercises/test_02_unilm_mask.py

UniLM (Dong et al. 2019, sections 2.2-2.3, Figure 1) trains ONE Transformer as four language models; the only
thing that changes between them is which tokens each token may attend to: the self-attention mask. The
sequence-to-sequence LM packs a source and a target into one sequence, [SOS] src [EOS] tgt [EOS]:

    a source token  attends to every source token (the source is read bidirectionally, like an encoder)
    a target token  attends to every source token, the target tokens to its left, and itself

The mask is a boolean matrix with one ROW per query token and one COLUMN per key token; True = "may attend".
A batch pads sequences to a common length L: padding rows and padding columns are all False.

    seq2seq_mask(n_src=2, n=5, L=6):     s s t t t p
                                     s   1 1 . . . .
                                     s   1 1 . . . .
                                     t   1 1 1 . . .
                                     t   1 1 1 1 . .
                                     t   1 1 1 1 1 .
                                     p   . . . . . .      (p: padding)

Contract
    seq2seq_mask(n_src, n, L) -> (L, L) torch.bool tensor
    n_src   tokens of the source part ([SOS] src [EOS] counted); 0 <= n_src <= n
    n       real tokens of the sequence (source + target); n <= L
    L       the padded length

Bonus (the other two LMs of Figure 1, graded if you write them):
    left_to_right_mask(n, L)   token i attends to tokens j <= i            (GPT)
    right_to_left_mask(n, L)   token i attends to tokens j >= i
"""
import torch


def seq2seq_mask(n_src, n, L):
    """(L, L) bool: UniLM's seq2seq mask for a sequence of n real tokens, the first n_src of them the source."""
    # TODO 1: make the grid of query indices i (a column) and key indices j (a row); broadcasting does the rest.
    # TODO 2: write the rule: key j is visible to query i when j is in the source, or j is at or left of i.
    # TODO 3: hide padding: rows i >= n and columns j >= n are False.
    #
    # Hint 1: every cell (i, j) answers one yes/no question, "may query i read key j?": answer all L * L of
    #         them at once by comparing a column of query indices with a row of key indices (broadcasting).
    # Hint 2: three conditions: j is in the source (j < n_src), j is at or left of i (j <= i), and both i and j
    #         are real tokens (below n). Which two are alternatives (|), and which must always hold (&)?
    # Hint 3: i = torch.arange(L)[:, None] is (L, 1) and j = torch.arange(L)[None, :] is (1, L); one line of
    #         comparisons joined by | and & gives the (L, L) bool mask. Check it on the picture above.
    raise NotImplementedError("exercise 2: write seq2seq_mask (see the TODOs)")


def left_to_right_mask(n, L):
    """Bonus: (L, L) bool, token i attends to tokens j <= i (real tokens only)."""
    raise NotImplementedError("exercise 2 bonus: write left_to_right_mask")


def right_to_left_mask(n, L):
    """Bonus: (L, L) bool, token i attends to tokens j >= i (real tokens only)."""
    raise NotImplementedError("exercise 2 bonus: write right_to_left_mask")

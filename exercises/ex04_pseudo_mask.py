"""Exercise 4: UniLMv2's pseudo-masked attention mask, from token kinds and factorization steps (about 40 minutes).

Read first: notebooks/03_pmlm.ipynb ("The layout", "The mask") and notebooks/02_masks.ipynb ("UniLMv2: the
pseudo-masked LM (Figure 5)"), then UniLMv2 section 3.2. Do exercise 3 first.
Grade it:   python -m pytest exercises/test_04_pseudo_mask.py

UniLMv2 (Bao et al. 2020, section 3.2, Figures 4 and 5) trains an autoencoding LM and a partially
autoregressive LM in ONE forward pass. The masked blocks are appended to the sequence twice: their ORIGINAL
tokens (the context of later blocks) and one PSEUDO token [P] per token (the queries that predict them). The
blocks, in factorization order, are steps 1, 2, ...; the paper's example, x1..x6 with blocks {x4, x5} (step 1)
then {x2} (step 2):

                  x1 M2 x3 M4 M5 x6 | x4 x5 P4 P5 x2 P2
    kind          CTX ............. | ORIG  PSEUDO ORIG PSEUDO
    step (step)  0 ............... | 1  1  1  1   2    2

Who may attend whom (row = query, column = key; Figure 5):

    a CTX token (the text with [M] slots)  attends to the context only
    an ORIG token of step b                attends to the context + the ORIG tokens of steps <= b
    a PSEUDO token [P] of step b           attends to the context + the ORIG tokens of steps <  b
                                                                    + the PSEUDO tokens of step b
    PAD                                    attends nothing and is attended by nobody

Two mistakes the paper warns about: a [P] that sees the original of its own block reads its answer (EXPLICIT
leakage); a context token that sees an appended original passes it on to every [P] (IMPLICIT leakage). The
grader runs the project's leakage checker with your mask, so you will see which prediction could read what.

Contract
    pseudo_masked_mask(kind, step) -> (B, L, L) torch.bool, True = query i may attend key j
    kind, step   (B, L) long tensors; kind uses the constants CTX, ORIG, PSEUDO, PAD imported below
Write the rule yourself: the project's mask functions count as copying (exercises/README.md, "Your own work").
"""
import torch  # noqa: F401  (yours to use)

from objectives.masks import CTX, ORIG, PAD, PSEUDO  # noqa: F401  (the kinds)


def pseudo_masked_mask(kind, step):
    """(B, L, L) bool: UniLMv2's pseudo-masked LM mask (Figure 5) from per-token kinds and steps."""
    # TODO 1: make query-side (B, L, 1) and key-side (B, 1, L) views of kind and step.
    # TODO 2: write one boolean (B, L, L) term per line of the table in the module docstring.
    # TODO 3: OR them together; make sure padding rows and padding keys come out False.
    #
    # Hint 1: each line of the table in the docstring is one boolean (B, L, L) term; a cell is True when any
    #         term is. Four lines, four terms.
    # Hint 2: the query side of kind is kind[:, :, None] (B, L, 1), the key side kind[:, None, :] (B, 1, L);
    #         comparing them broadcasts to (B, L, L). A term tests the query's kind, the key's kind, and
    #         (except for the context) compares the key's step with the query's.
    # Hint 3: the ORIG line is (q_kind == ORIG) & (k_kind == ORIG) & (k_step <= q_step). The two PSEUDO lines
    #         differ from it in the kinds and in one comparison each (earlier steps only; its own step only).
    #         The context line compares no steps, but a padding query sees nothing.
    raise NotImplementedError("exercise 4: write pseudo_masked_mask (see the TODOs)")

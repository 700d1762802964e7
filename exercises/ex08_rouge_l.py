"""Exercise 8: ROUGE-L, the longest-common-subsequence F-measure of one prediction and one reference
(about 30 minutes).

Read first: notebooks/06_decoding.ipynb (part 3, "ROUGE-L: the longest common subsequence"), then Lin 2004 section 3.1.
Grade it:   python -m pytest exercises/test_08_rouge_l.py

The papers report summaries with ROUGE (Lin 2004). ROUGE-L looks at the longest common subsequence (LCS) of the
two token lists: tokens that appear in both IN THE SAME ORDER, not necessarily next to each other. Lin's example:

    reference   police killed the gunman
    prediction  police kill the gunman      LCS = police the gunman            (3 tokens)
    prediction  the gunman kill police      LCS = the gunman                   (2 tokens)

With m = |reference|, n = |prediction| (Lin 2004, section 3.1, Eq. 2-4, with rouge-score's F):

    recall R = LCS / m,   precision P = LCS / n,   F = 2 P R / (P + R)   (0 when P + R = 0)
    and P = R = F = 0 when either text has no tokens.

The LCS length comes from a table filled row by row (dynamic programming):

    table[i][j] = LCS of a[:i] and b[:j];  table[0][*] = table[*][0] = 0
    table[i][j] = table[i-1][j-1] + 1                      if a[i-1] == b[j-1]
                = max(table[i-1][j], table[i][j-1])        otherwise

Contract
    lcs_length(a, b) -> int              a, b: lists of tokens
    rouge_l(prediction, reference) -> {"precision": P, "recall": R, "fmeasure": F}
        prediction, reference: strings, tokenized with evaluate.rouge_tokenize (given below: lowercase, and
        anything but a-z and 0-9 separates tokens), as rouge-score does.
"""
from evaluate import rouge_tokenize  # noqa: F401  (the tokenizer is given)


def lcs_length(a, b):
    """Length of the longest common subsequence of the token lists a and b."""
    # TODO: the (len(a) + 1) x (len(b) + 1) table above, filled row by row; the answer is its last cell.
    #
    # Hint 1: the table has a row per prefix of a and a column per prefix of b, zeros on row 0 and column 0;
    #         the answer is the cell for the whole of a and the whole of b.
    # Hint 2: two loops, i from 1 to len(a) and j from 1 to len(b), and the two cases of the recurrence: the
    #         tokens a[i - 1] and b[j - 1] match, or they do not.
    # Hint 3: build the rows with a comprehension, one new list per row ([[0] * ...] * n is ONE row n times);
    #         only the previous row is ever read, so two rows of len(b) + 1 are enough.
    raise NotImplementedError("exercise 8: write lcs_length (see the TODO)")


def rouge_l(prediction, reference):
    """ROUGE-L of one pair of texts: {"precision", "recall", "fmeasure"}."""
    # TODO: tokenize both, handle the empty case, then P, R and F from lcs_length.
    #
    # Hint 1: ROUGE-L is three numbers from one LCS: tokenize both texts with rouge_tokenize first.
    # Hint 2: precision divides the LCS by the PREDICTION's length, recall by the REFERENCE's.
    # Hint 3: return zeros before dividing when a text has no tokens; F is 2 P R / (P + R) only when
    #         P + R > 0.
    raise NotImplementedError("exercise 8: write rouge_l (see the TODO)")

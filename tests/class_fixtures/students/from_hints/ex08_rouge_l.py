"""Exercise 8 as a student writes it from the stub's hints: the full table, one new list per row."""
from evaluate import rouge_tokenize


def lcs_length(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                table[i][j] = table[i - 1][j - 1] + 1
            else:
                table[i][j] = max(table[i - 1][j], table[i][j - 1])
    return table[len(a)][len(b)]


def rouge_l(prediction, reference):
    pred = rouge_tokenize(prediction)
    ref = rouge_tokenize(reference)
    if len(pred) == 0 or len(ref) == 0:
        return {"precision": 0.0, "recall": 0.0, "fmeasure": 0.0}
    lcs = lcs_length(pred, ref)
    p = lcs / len(pred)
    r = lcs / len(ref)
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return {"precision": p, "recall": r, "fmeasure": f}

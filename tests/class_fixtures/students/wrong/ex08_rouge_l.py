"""Wrong: precision and recall swapped (the LCS is right)."""
from evaluate import rouge_tokenize


def lcs_length(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            same = a[i - 1] == b[j - 1]
            table[i][j] = table[i - 1][j - 1] + 1 if same else max(table[i - 1][j], table[i][j - 1])
    return table[-1][-1]


def rouge_l(prediction, reference):
    pred, ref = rouge_tokenize(prediction), rouge_tokenize(reference)
    if not pred or not ref:
        return {"precision": 0.0, "recall": 0.0, "fmeasure": 0.0}
    lcs = lcs_length(ref, pred)
    p, r = lcs / len(ref), lcs / len(pred)
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "fmeasure": f}

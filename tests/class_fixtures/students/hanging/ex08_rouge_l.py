"""Honest exercise 8 of a student whose exercise 2 hangs: it is still graded."""
from evaluate import rouge_tokenize


def lcs_length(a, b):
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l(prediction, reference):
    pred, ref = rouge_tokenize(prediction), rouge_tokenize(reference)
    rouge = {"precision": 0.0, "recall": 0.0, "fmeasure": 0.0}
    if not pred or not ref:
        return rouge
    common = lcs_length(ref, pred)
    rouge["precision"] = common / len(pred)
    rouge["recall"] = common / len(ref)
    total = rouge["precision"] + rouge["recall"]
    if total > 0:
        rouge["fmeasure"] = 2 * rouge["precision"] * rouge["recall"] / total
    return rouge

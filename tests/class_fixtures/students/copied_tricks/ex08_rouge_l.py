"""Dynamic: globals() and a computed getattr on evaluate."""
import evaluate


def lcs_length(a, b):
    return getattr(evaluate, "_" + "lcs_table")(a, b)[-1][-1]


def rouge_l(prediction, reference):
    return globals()["evaluate"].rouge_scores(prediction, reference)["rougeL"]

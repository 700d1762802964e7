"""Copied: Google's rouge-score for ROUGE-L, evaluate.py's table for the LCS."""
from rouge_score import rouge_scorer

import evaluate


def lcs_length(a, b):
    return evaluate._lcs_table(a, b)[-1][-1]


def rouge_l(prediction, reference):
    s = rouge_scorer.RougeScorer(["rougeL"]).score(reference, prediction)["rougeL"]
    return {"precision": s.precision, "recall": s.recall, "fmeasure": s.fmeasure}

"""Grader of exercise 8 (ROUGE-L of one pair): your LCS and ROUGE-L against evaluate.py's (which the project's
tests hold equal to Google's rouge-score).

    python -m pytest exercises/test_08_rouge_l.py
"""
import random

import pytest

import evaluate
from exercises import _grading as grading

ex = grading.load("ex08_rouge_l")


def one_lcs(a, b):
    """One longest common subsequence of a and b, to show in a message."""
    return [a[i] for i, _ in evaluate.lcs_alignment(a, b)[1]]


def check_lcs(a, b):
    got, want = ex.lcs_length(a, b), evaluate._lcs_table(a, b)[-1][-1]
    assert got == want, f"lcs_length({a}, {b}) = {got}, but the longest common subsequence has {want} tokens, " \
                        f"e.g. {one_lcs(a, b)} (in the same order in both, gaps allowed)"


def check_rouge(prediction, reference):
    pred, ref = evaluate.rouge_tokenize(prediction), evaluate.rouge_tokenize(reference)
    call = f"rouge_l({prediction!r}, {reference!r})"
    try:
        got = ex.rouge_l(prediction, reference)
    except ZeroDivisionError:
        empty = repr(prediction) if not pred else repr(reference)
        raise AssertionError(f"{call} divided by zero: {empty} has no tokens; return zeros before dividing when a "
                             "text has no tokens (P = R = F = 0)") from None
    want = evaluate.rouge_scores(prediction, reference)["rougeL"]
    assert isinstance(got, dict) and set(got) >= {"precision", "recall", "fmeasure"}, \
        f"return a dict with precision, recall and fmeasure; got {got}"
    same = lambda a, b: all(a[k] == pytest.approx(b[k], abs=1e-9) for k in ("precision", "recall", "fmeasure"))
    if same(got, want):
        return
    if pred and ref:                                     # the LCS first: P, R and F all stand on it
        check_lcs(ref, pred)
    split = evaluate._rouge_l(reference.split(), prediction.split())
    assert not same(got, split), \
        f"{call}: {got}, the scores of the texts split at spaces; tokenize both with rouge_tokenize (lowercase, " \
        f"and anything but a-z and 0-9 separates tokens): {prediction!r} is {pred}, {reference!r} is {ref}"
    lcs = evaluate._lcs_table(ref, pred)[-1][-1] if pred and ref else 0
    swapped = got["precision"] == pytest.approx(want["recall"]) and \
        got["recall"] == pytest.approx(want["precision"])
    assert not swapped or want["precision"] == pytest.approx(want["recall"]), \
        f"{call}: precision and recall are swapped (yours {got['precision']:.4f}, " \
        f"{got['recall']:.4f}): precision = LCS / |prediction| = {lcs} / {len(pred)}, " \
        f"recall = LCS / |reference| = {lcs} / {len(ref)} (Lin 2004, Eq. 2-3)"
    for key, why in (("precision", f"LCS / |prediction| = {lcs} / {len(pred)}"),
                     ("recall", f"LCS / |reference| = {lcs} / {len(ref)}"),
                     ("fmeasure", "2 P R / (P + R), 0 when P + R = 0")):
        assert got[key] == pytest.approx(want[key], abs=1e-9), \
            f"{call}: {key} {got[key]!r}, the project's {want[key]:.4f} = {why}" + \
            (" (an empty text scores 0)" if not pred or not ref else "")


def test_precision_and_recall():
    """The first thing to get right: precision is over the PREDICTION, recall over the REFERENCE."""
    check_rouge("the cat sat on the mat", "the cat sat")
    check_rouge("police killed", "police killed the gunman")


def test_lins_example():
    ref = "police killed the gunman".split()
    check_lcs(ref, "police kill the gunman".split())
    check_lcs(ref, "the gunman kill police".split())
    check_rouge("police kill the gunman", "police killed the gunman")
    check_rouge("the gunman kill police", "police killed the gunman")


@pytest.mark.parametrize("a, b", [([], []), (["a"], []), ([], ["a"]), (["a"], ["a"]), (list("abcbdab"), list("bdcaba")),
                                  (list("aaaa"), list("aa")), (list("abc"), list("def"))])
def test_lcs_edge_cases(a, b):
    check_lcs(a, b)


def test_lcs_random():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 15))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 15))]
        check_lcs(a, b)


@pytest.mark.parametrize("pred, ref", [("", "a b"), ("a b", ""), ("", ""), ("The Cat!", "the cat"),
                                       ("x y z", "a b c"), ("a a a", "a"), ("sat the cat", "the cat sat")])
def test_rouge_edge_cases(pred, ref):
    """Empty texts, case and punctuation (the tokenizer), no overlap, repeated words."""
    check_rouge(pred, ref)


def test_rouge_random():
    rng = random.Random(1)
    words = "the a cat dog sat on mat it ran".split()
    for _ in range(200):
        pred = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        ref = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        check_rouge(pred, ref)


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    check_lcs(list("abc"), list("acb"))

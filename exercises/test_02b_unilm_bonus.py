"""Grader of exercise 2's bonus (left-to-right and right-to-left masks), apart from the main exercise so that
an unattempted bonus does not fail it.

    python -m pytest exercises/test_02b_unilm_bonus.py
"""
from exercises import _grading as grading
from exercises.test_02_unilm_mask import compare
from objectives import masks

ex = grading.load("ex02_unilm_mask")
OPTIONAL = True               # the class grader reports this grader as an optional bonus, outside the total


def test_bonus_left_to_right():
    for n, L in ((3, 3), (5, 7), (1, 2), (8, 8)):
        got = ex.left_to_right_mask(n, L)
        compare(got, masks.left_to_right([n], L)[0], L, f"left_to_right_mask(n={n}, L={L})",
                lambda i, j, g: "token i sees tokens j <= i (and padding nothing)")


def test_bonus_right_to_left():
    for n, L in ((3, 3), (5, 7), (1, 2), (8, 8)):
        got = ex.right_to_left_mask(n, L)
        compare(got, masks.right_to_left([n], L)[0], L, f"right_to_left_mask(n={n}, L={L})",
                lambda i, j, g: "token i sees tokens j >= i (and padding nothing)")

"""Copied: a class fixture, its folder put on the import path."""
import sys

sys.path.insert(0, "tests")
from class_fixtures.students.honest.ex02_unilm_mask import left_to_right_mask, right_to_left_mask, seq2seq_mask  # noqa

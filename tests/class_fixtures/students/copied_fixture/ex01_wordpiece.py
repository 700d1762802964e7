"""Copied: a grader's helper, which calls the project's WordPiece to compare with."""
from exercises.test_01_wordpiece import project


def encode_word(word, vocab):
    return project(word, vocab)

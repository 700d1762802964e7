"""Grader of exercise 1 (WordPiece encoding of one word): your encode_word against tokenizer.py's.

    python -m pytest exercises/test_01_wordpiece.py               # grades exercises/ex01_wordpiece.py
    UNIGEN_REFERENCE=1 python -m pytest exercises/test_01_wordpiece.py    # grades the project's own code
"""
import random

import pydoc_data.topics
import pytest

from exercises import _grading as grading
from tokenizer import SPECIAL_TOKENS, WordPiece, basic_tokenize

ex = grading.load("ex01_wordpiece")


def project(word, vocab):
    """The project's answer: tokenizer.WordPiece's encoding of one word, as piece strings."""
    tok = WordPiece(list(SPECIAL_TOKENS) + sorted(set(vocab) - set(SPECIAL_TOKENS)))
    return [tok.id_to_token(i) for i in tok._wordpiece(word)]


def explain(word, got, want, vocab):
    """Why `got` is not `want`, in words: the rule the difference shows, never one it does not."""
    head = f"encode_word({word[:40]!r}{'...' if len(word) > 40 else ''}) gave {got[:8]}, the project gives {want[:8]}"
    if want == ["[UNK]"] and len(word) > 100:
        return head + ": a word longer than 100 characters is [UNK] without looking"
    if got == ["[UNK]"] and len(word) == 100:
        return head + (": a word of exactly 100 characters is still encoded; only a word LONGER than 100 is [UNK] "
                       "without looking")
    if want == ["[UNK]"]:
        return head + (": at some point no vocabulary piece matches the rest of the word, and then the WHOLE word "
                       "is [UNK], not only the rest (BERT keeps no half-encoded words)")
    if got == ["[UNK]"]:
        return head + (": the vocabulary covers this word (the project's pieces above are all in it), so there is "
                       "always a piece to take; find where your walk stopped finding one")
    k = next((k for k, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    if k == len(got) or k == len(want):
        return head + f": the pieces agree up to piece {k}, then one list stops early"
    g, w = got[k], want[k]
    if w.startswith("##") and not g.startswith("##"):
        return head + f": piece {k} continues the word, so it is looked up with '##' in front ({w!r})"
    if k == 0 and g.startswith("##"):
        return head + ": the FIRST piece of a word has no '##' in front"
    if g not in vocab:
        return head + f": piece {k}, {g!r}, is not in the vocabulary"
    if len(w) > len(g) and w.startswith(g):
        return head + (f": at piece {k} you took {g!r}, but {w!r} is in the vocabulary and longer: WordPiece takes "
                       "the LONGEST matching piece first (greedy longest-match-first)")
    return head + f": they first differ at piece {k}: {g!r} vs {w!r}"


def check(word, vocab):
    got, want = ex.encode_word(word, vocab), project(word, vocab)
    assert isinstance(got, list), f"encode_word must return a list of strings, got {type(got).__name__}"
    assert got == want, explain(word, got, want, vocab)


BERT = {"un", "##aff", "##able", "u", "##n", "##a", "##af", "##ab", "##ble", "a", "able"}


def test_the_two_rules():
    """BERT's example word with a vocabulary where each rule shows: every letter is a piece (so a walk that takes
    the SHORTEST piece first does not get stuck, it just gives other pieces), and "aff" is a piece both at the
    start of a word and as a continuation "##aff" (so a walk that forgets the '##' finds a piece, the wrong one)."""
    check("unaffable", BERT | {"aff", "##f", "##b", "##l", "##e"})


def test_berts_example():
    """BERT's own docstring example: un ##aff ##able."""
    check("unaffable", BERT)
    assert ex.encode_word("unaffable", BERT) == ["un", "##aff", "##able"]


@pytest.mark.parametrize("word", ["un", "u", "a", "able", "unable", "unaffab", "aaa", "nu", "ununable"])
def test_fixed_words(word):
    check(word, BERT)


def test_unknown_words():
    check("unaffablex", BERT)                          # "x" is nowhere: the whole word is [UNK]
    check("naffable", BERT)                            # no piece starts with "n" at the start of a word
    check("", BERT)                                    # the empty word: no pieces
    check("a" * 101, {"a", "##a"})                     # too long: [UNK] without looking
    check("a" * 100, {"a", "##a", "##aa"})             # 100 characters is still fine


def test_random_vocabularies():
    rng = random.Random(0)
    for case in range(300):
        alphabet = "abc"[:rng.randint(1, 3)] + "d" * (case % 7 == 0)
        pieces = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 12))}
        vocab = {p for p in pieces} | {"##" + p for p in pieces if rng.random() < 0.7}
        vocab |= {c for c in alphabet if rng.random() < 0.8} | {"##" + c for c in alphabet if rng.random() < 0.8}
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        check(word, vocab)


def test_a_trained_vocabulary():
    """Every word of Python's help topics, with a vocabulary the project trained on them."""
    texts = [text for _, text in sorted(pydoc_data.topics.topics.items())[:60]]
    tok = WordPiece.train(texts, vocab_size=600, progress=False)
    vocab = set(tok.vocab) - set(SPECIAL_TOKENS)
    words = sorted({w for t in texts[:20] for w in basic_tokenize(t)})
    for word in words:
        check(word, vocab)


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    check("unaffable", BERT)

"""Tests for evaluate.py: hand-worked examples, and parity with the reference libraries
(rouge-score 0.1.2, sacrebleu 2.6.0, nltk's PorterStemmer), which are imported here only."""
import ast
import glob
import json
import math
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import pydoc_data.topics
import sacrebleu
from nltk.stem.porter import PorterStemmer
from rouge_score import rouge_scorer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import evaluate as E  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURES = ("precision", "recall", "fmeasure")

# ----------------------------------------------------------------------------- text sources

TOPICS = list(pydoc_data.topics.topics.values())  # ships with CPython: real English prose
SENTENCES = [s.strip() for text in TOPICS for s in re.split(r"(?<=[.!?])\s+", text)
             if len(s.split()) >= 3][:4000]

WORDS = ["the", "The", "THE", "cat", "cats", "Cats", "running", "runs", "ran", "happily",
         "happiness", "generously", "skies", "sky", "dying", "news", "agreed", "feed",
         "conditional", "relational", "hopping", "falling", "co-operate", "don't", "U.S.",
         "e-mail", "naïve", "Straße", "café", "İstanbul", "K", "x", "a", "I", "is", "it's",
         "2010s", "3", "100", "3.14", "1990-2000", "1,000", "mat", "on", "sat", "dog"]
PUNCT = [",", ".", "!", "?", ";", ":", "(", ")", '"', "'", "-", "--", "...", "&amp;", "&",
         "&quot;", "/", "’", "<skipped>", "@", "#", "%"]


def random_text(rng, max_len=25, newlines=True):
    """Seeded messy text: case, punctuation glued or spaced, numbers, repeats, newlines, empty."""
    n = rng.choice([0, 1, 2, 3, 5, 8, 13, max_len])
    pieces = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            pieces.append(rng.choice(WORDS))
        elif r < 0.75:
            pieces.append(rng.choice(PUNCT))
        elif r < 0.85:
            pieces.append(str(rng.randint(0, 2000)))
        elif pieces:
            pieces.append(pieces[-1])  # a repeat
        else:
            pieces.append(rng.choice(SENTENCES).split()[0])
    text = ""
    for p in pieces:
        sep = rng.choice([" ", " ", " ", "", "\n" if newlines else " ", "  "])
        text += sep + p
    return text if rng.random() < 0.8 else text.strip()


def perturb(rng, sentence):
    """A 'prediction' made from a reference: drop some words, shuffle a window, swap in others."""
    words = [w for w in sentence.split() if rng.random() > 0.2]
    if len(words) > 3:
        i = rng.randrange(len(words) - 2)
        window = words[i:i + 3]
        rng.shuffle(window)
        words[i:i + 3] = window
    if words and rng.random() < 0.5:
        words[rng.randrange(len(words))] = rng.choice(WORDS)
    return " ".join(words)


def real_pairs(rng, n):
    """Adjacent sentences, perturbed copies, and multi-sentence (newline-joined) summaries."""
    pairs = []
    for k in range(n):
        i = rng.randrange(len(SENTENCES) - 4)
        kind = k % 3
        if kind == 0:
            pairs.append((SENTENCES[i], SENTENCES[i + 1]))
        elif kind == 1:
            pairs.append((perturb(rng, SENTENCES[i]), SENTENCES[i]))
        else:
            ref = SENTENCES[i:i + rng.randint(1, 4)]
            pred = [perturb(rng, s) for s in ref if rng.random() < 0.8] + [rng.choice(SENTENCES)]
            rng.shuffle(pred)
            pairs.append(("\n".join(pred), "\n".join(ref)))
    return pairs


def oracle_rouge(stem):
    return rouge_scorer.RougeScorer(list(E.ROUGE_TYPES), use_stemmer=stem)


def assert_rouge_equal(prediction, reference, stem, scorer, tol=1e-12):
    ours = E.rouge_scores(prediction, reference, stem)
    theirs = scorer.score(reference, prediction)  # rouge-score takes (target, prediction)
    for t in E.ROUGE_TYPES:
        for j, m in enumerate(MEASURES):
            assert abs(ours[t][m] - theirs[t][j]) <= tol, (t, m, prediction, reference)


# ----------------------------------------------------------------------------- ROUGE by hand

def close(a, b):
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-12)


def test_rouge_hand_cat_on_mat():
    s = E.rouge_scores("the cat sat on the mat", "the cat is on the mat")
    # unigrams: the x2, cat, on, mat match (sat / is do not) -> 5 of 6 on both sides
    assert all(close(s["rouge1"][m], 5 / 6) for m in MEASURES)
    # bigrams: "the cat", "on the", "the mat" match out of 5 each -> 3/5
    assert all(close(s["rouge2"][m], 3 / 5) for m in MEASURES)
    # LCS "the cat on the mat" = 5 tokens -> 5/6; one sentence each, so Lsum = L
    assert all(close(s["rougeL"][m], 5 / 6) and close(s["rougeLsum"][m], 5 / 6) for m in MEASURES)


def test_rouge_hand_asymmetric_and_clipped():
    s = E.rouge_scores("A b, c d!", "a c e")
    # tokens pred [a b c d], ref [a c e]: 2 unigram hits -> P 2/4, R 2/3, F = 2PR/(P+R) = 4/7
    assert close(s["rouge1"]["precision"], 0.5) and close(s["rouge1"]["recall"], 2 / 3)
    assert close(s["rouge1"]["fmeasure"], 4 / 7)
    # no bigram in common ("a c" is not a bigram of the prediction) -> all zero
    assert s["rouge2"] == {"precision": 0.0, "recall": 0.0, "fmeasure": 0.0}
    # LCS "a c" = 2 -> same numbers as ROUGE-1
    assert close(s["rougeL"]["fmeasure"], 4 / 7)
    s = E.rouge_scores("the the the the", "the cat")
    # "the" counts are clipped: min(4, 1) = 1 hit -> P 1/4, R 1/2, F = (2 * 1/8) / (3/4) = 1/3
    assert close(s["rouge1"]["precision"], 0.25) and close(s["rouge1"]["recall"], 0.5)
    assert close(s["rouge1"]["fmeasure"], 1 / 3)


def test_rouge_lsum_hand_union_lcs_lin2004_example():
    # Lin (2004) Sec. 3.2: r = w1..w5, c1 = w1 w2 w6 w7 w8, c2 = w1 w3 w8 w9 w5.
    # LCS(r, c1) = w1 w2, LCS(r, c2) = w1 w3 w5, union = w1 w2 w3 w5 -> 4 hits.
    # |ref| = 5, |cand| = 10 -> P 4/10, R 4/5, F = 2 * 0.32 / 1.2 = 8/15
    s = E.rouge_scores("w1 w2 w6 w7 w8\nw1 w3 w8 w9 w5", "w1 w2 w3 w4 w5")["rougeLsum"]
    assert close(s["precision"], 0.4) and close(s["recall"], 0.8) and close(s["fmeasure"], 8 / 15)


def test_rouge_lsum_hand_no_double_counting():
    # ref has two sentences "a b", the candidate one sentence "a b". Each ref sentence's union LCS
    # is {a, b}, but the candidate owns only one "a" and one "b": hits = 2 (not 4).
    # P = 2/2, R = 2/4, F = 2/3. (The paper's plain sum would give P = 4/2 > 1.)
    s = E.rouge_scores("a b", "a b\na b")["rougeLsum"]
    assert close(s["precision"], 1.0) and close(s["recall"], 0.5) and close(s["fmeasure"], 2 / 3)


def test_lcs_alignment_hand_and_random():
    ref, pred = "the cat is on the mat".split(), "the cat sat on the mat".split()
    table, pairs = E.lcs_alignment(ref, pred)
    # table[i][j] = LCS of ref[:i] and pred[:j]: "the cat" = 2 after two words each, 5 in all
    assert len(table) == 7 and len(table[0]) == 7 and table[2][2] == 2 and table[-1][-1] == 5
    assert pairs == [(0, 0), (1, 1), (3, 3), (4, 4), (5, 5)]          # is / sat left out
    # Lin (2004) Sec. 3.2: LCS(r, c2) = w1 w3 w5 (reference positions 0, 2, 4); empty sides give nothing
    assert E.lcs_alignment("w1 w2 w3 w4 w5".split(), "w1 w3 w8 w9 w5".split())[1] == [(0, 0), (2, 1), (4, 4)]
    assert E.lcs_alignment([], ["a"]) == ([[0, 0]], [])
    rng = random.Random(3)
    for _ in range(200):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 9))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 9))]
        table, pairs = E.lcs_alignment(a, b)
        assert len(pairs) == table[-1][-1]                            # one LCS, of the full length
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(i0 < i1 and j0 < j1 for (i0, j0), (i1, j1) in zip(pairs, pairs[1:]))
        # the same LCS length as ROUGE-L's recall numerator
        if a and b:
            assert close(E.rouge_scores(" ".join(b), " ".join(a))["rougeL"]["recall"], len(pairs) / len(a))


@pytest.mark.parametrize("pred,ref", [("", ""), ("", "a b"), ("a b", ""), ("!!", "a"),
                                      ("\n\n", "a\n"), ("a", "a")])
def test_rouge_empty_inputs(pred, ref):
    s = E.rouge_scores(pred, ref)
    expected = 1.0 if pred == ref == "a" else 0.0
    assert all(s["rouge1"][m] == expected and s["rougeLsum"][m] == expected for m in MEASURES)
    assert_rouge_equal(pred, ref, False, oracle_rouge(False))


def test_rouge_stemming_changes_matches():
    # "running" -> "run" and "cats" -> "cat" under the Porter stemmer; "ran" is untouched (3 chars)
    plain = E.rouge_scores("cats running", "cat run")["rouge1"]["fmeasure"]
    stemmed = E.rouge_scores("cats running", "cat run", stem=True)["rouge1"]["fmeasure"]
    assert plain == 0.0 and stemmed == 1.0
    tokens = E.rouge_tokenize("The Cats' running-ran, 2010s!", stem=True)
    assert tokens == ["the", "cat", "run", "ran", "2010"]


# ----------------------------------------------------------------------------- ROUGE parity

@pytest.mark.parametrize("stem", [False, True])
def test_rouge_parity_random_texts(stem):
    rng, scorer = random.Random(1234 + stem), oracle_rouge(stem)
    for _ in range(400):
        pred, ref = random_text(rng), random_text(rng)
        if rng.random() < 0.3:  # make overlaps likely: the prediction borrows from the reference
            pred = ref[: rng.randint(0, len(ref))] + pred
        assert_rouge_equal(pred, ref, stem, scorer)


@pytest.mark.parametrize("stem", [False, True])
def test_rouge_parity_real_text(stem):
    rng, scorer = random.Random(99 + stem), oracle_rouge(stem)
    for pred, ref in real_pairs(rng, 300):
        assert_rouge_equal(pred, ref, stem, scorer)


def test_rouge_lsum_parity_ambiguous_lcs():
    # many tied LCSs (tiny vocabulary, repeats): the union depends on rouge-score's backtracking
    rng, scorer = random.Random(7), oracle_rouge(False)
    for _ in range(300):
        def text():
            return "\n".join(" ".join(rng.choice("abc") for _ in range(rng.randint(0, 7)))
                             for _ in range(rng.randint(1, 4)))
        assert_rouge_equal(text(), text(), False, scorer)


def test_rouge_corpus_mean_matches_oracle():
    rng, scorer = random.Random(5), oracle_rouge(True)
    pairs = real_pairs(rng, 60)
    preds, refs = [p for p, _ in pairs], [r for _, r in pairs]
    ours = E.rouge(preds, refs, stem=True)
    theirs = [scorer.score(r, p) for p, r in pairs]
    for t in E.ROUGE_TYPES:
        for j, m in enumerate(MEASURES):
            mean = np.mean([s[t][j] for s in theirs])
            assert abs(ours[t][m] - mean) < 1e-12 and 0.0 <= ours[t][m] <= 1.0


def test_rouge_bad_arguments():
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        E.rouge(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no predictions"):
        E.rouge([], [])
    with pytest.raises(TypeError):
        E.rouge("a b", "a b")


# ----------------------------------------------------------------------------- bootstrap

def test_rouge_bootstrap_deterministic_and_contains_mean():
    rng = random.Random(11)
    pairs = real_pairs(rng, 50)
    preds, refs = [p for p, _ in pairs], [r for _, r in pairs]
    a = E.rouge_bootstrap(preds, refs, n_samples=300, seed=3)
    b = E.rouge_bootstrap(preds, refs, n_samples=300, seed=3)
    c = E.rouge_bootstrap(preds, refs, n_samples=300, seed=4)
    assert a == b and a != c
    means = E.rouge(preds, refs)
    for t in E.ROUGE_TYPES:
        for m in MEASURES:
            ci = a[t][m]
            assert abs(ci["mean"] - means[t][m]) < 1e-12
            assert ci["low"] <= ci["mean"] <= ci["high"]
            assert ci["high"] - ci["low"] > 0  # 50 different pairs: the interval is not a point
            assert 0.0 <= ci["low"] and ci["high"] <= 1.0


def test_rouge_bootstrap_single_pair_is_a_point():
    ci = E.rouge_bootstrap(["the cat sat"], ["the cat"], n_samples=20)["rouge1"]["recall"]
    assert ci == {"mean": 1.0, "low": 1.0, "high": 1.0}


# ----------------------------------------------------------------------------- Porter stemmer

TRICKY = ["generously", "dying", "lying", "tying", "skies", "sky", "news", "feed", "agreed",
          "conditional", "rational", "relational", "hopping", "falling", "hissing", "fizzed",
          "failing", "filing", "happy", "enjoy", "spied", "died", "flies", "ties", "cries",
          "caresses", "ponies", "caress", "cats", "plastered", "bled", "motoring", "sing",
          "conflated", "troubled", "sized", "tanned", "controll", "roll", "probate", "rate",
          "cease", "geology", "theology", "archaeology", "radically", "fully", "hopefulli",
          "innings", "inning", "outings", "cannings", "howe", "proceed", "exceed", "succeed",
          "proceeding", "y", "yy", "yyyy", "ys", "by", "say", "syzygy", "toy", "agreement",
          "adoption", "a", "is", "as", "ow", "owing", "bowing", "ies", "eed", "ing", "ed",
          "triplicate", "formative", "formalize", "electriciti", "electrical", "hopeful",
          "goodness", "revival", "allowance", "inference", "airliner", "gyroscopic",
          "adjustable", "defensible", "irritant", "replacement", "adjustment", "dependent",
          "homologou", "communism", "activate", "angulariti", "homologous", "effective",
          "bowdlerize", "vietnamization", "predication", "operator", "feudalism",
          "decisiveness", "hopefulness", "callousness", "formaliti", "sensitiviti",
          "sensibiliti", "Running", "CATS", "Skies", "abc123s", "2010s", "1234", "aing", "ying"]
SUFFIXES = ["", "s", "es", "ies", "sses", "ss", "ed", "eed", "ied", "ing", "y", "ly", "ational",
            "tional", "enci", "anci", "izer", "bli", "alli", "entli", "eli", "ousli", "ization",
            "ation", "ator", "alism", "iveness", "fulness", "ousness", "aliti", "iviti", "biliti",
            "fulli", "logi", "icate", "ative", "alize", "iciti", "ical", "ful", "ness", "al",
            "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "sion",
            "tion", "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize", "e", "ll", "ling"]


def porter_vocabulary():
    """Every distinct lowercase word of pydoc_data.topics and of the stdlib's top-level modules,
    tricky words, and seeded random roots glued to every Porter suffix."""
    words = set(TRICKY)
    texts = TOPICS + [open(f, encoding="utf-8", errors="replace").read()
                      for f in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))]
    for text in texts:
        words.update(re.findall(r"[a-z]+", text.lower()))
    rng = random.Random(0)
    letters = "aeiouy" * 3 + "bcdfghjklmnpqrstvwxz" + "lsztw" * 2
    for _ in range(400):
        root = "".join(rng.choice(letters) for _ in range(rng.randint(1, 7)))
        words.update(root + s for s in SUFFIXES)
    return sorted(words)


def test_porter_stem_matches_nltk():
    nltk_stem, vocab = PorterStemmer().stem, porter_vocabulary()
    assert len(vocab) > 30000
    mismatches = [(w, E.porter_stem(w), nltk_stem(w)) for w in vocab if E.porter_stem(w) != nltk_stem(w)]
    assert mismatches == []


def test_porter_stem_hand_examples():
    # the paper's and NLTK's own examples
    expected = {"caresses": "caress", "ponies": "poni", "ties": "tie", "cats": "cat",
                "agreed": "agre", "feed": "feed", "plastered": "plaster", "motoring": "motor",
                "hopping": "hop", "falling": "fall", "filing": "file", "happy": "happi",
                "enjoy": "enjoy", "relational": "relat", "rational": "ration", "conditional": "condit",
                "skies": "sky", "dying": "die", "news": "news", "generously": "gener"}
    assert {w: E.porter_stem(w) for w in expected} == expected


# ----------------------------------------------------------------------------- BLEU by hand

def test_bleu_hand_cat_on_mat():
    d = E.bleu_details(["the cat sat on the mat"], ["the cat is on the mat"])
    # p1 = 5/6, p2 = 3/5 (the cat, on the, the mat), p3 = 1/4 (on the mat),
    # p4 = 0/3 -> 'exp' smoothing: 1 / (2 * 3) = 1/6. Lengths 6 = 6 -> BP = 1.
    # BLEU = 100 * (5/6 * 3/5 * 1/4 * 1/6) ** (1/4) = 100 * (1/48) ** 0.25 = 37.99...
    assert d["counts"] == [5, 3, 1, 0] and d["totals"] == [6, 5, 4, 3] and d["bp"] == 1.0
    assert math.isclose(d["score"], 100 * (1 / 48) ** 0.25, rel_tol=1e-12)


def test_bleu_hand_brevity_and_multi_reference():
    # every n-gram matches, but 4 tokens vs 8: BP = exp(1 - 8/4) = e^-1 -> 36.79
    assert math.isclose(E.bleu(["a b c d"], ["a b c d e f g h"]), 100 * math.exp(-1), rel_tol=1e-12)
    # refs "a b x y z" and "q b c d": clipped against the union of both; closest ref length 4.
    # p1 = 4/4, p2 = 3/3 (ab, bc, cd), p3 = 1/2 (b c d), p4 = 0/1 -> 1/2. BLEU = 100 * 0.25 ** 0.25
    assert math.isclose(E.bleu(["a b c d"], [["a b x y z", "q b c d"]]), 100 * 0.25 ** 0.25,
                        rel_tol=1e-12)
    # ref lengths 3 and 5 are equally close to 4: the shorter one is used (no brevity penalty)
    assert E.bleu_details(["a b c d"], [["a b c", "a b c d e"]])["ref_len"] == 3


def test_bleu_degenerate():
    assert E.bleu([""], ["a b c"]) == 0.0  # empty hypothesis
    assert E.bleu(["x y z w"], ["a b c d"]) == 0.0  # nothing matches
    assert E.bleu(["a b c"], ["a b c"]) == 0.0  # no 4-grams at all: p4 = 0
    with pytest.raises(TypeError, match=r"references\[0\]"):
        E.bleu(["a"], [[]])
    with pytest.raises(ValueError, match="tokenize"):
        E.bleu(["a"], ["a"], tokenize="intl")


def test_tokenize_13a_hand():
    assert E.tokenize_13a("Hello, world! It's 3.5-4 (approx).") == [
        "Hello", ",", "world", "!", "It's", "3.5", "-", "4", "(", "approx", ")", "."]
    assert E.tokenize_13a("1,000 &amp; e-mail") == ["1,000", "&", "e-mail"]


# ----------------------------------------------------------------------------- BLEU parity

def sacrebleu_score(preds, refs_per_pred, tokenize):
    """Our per-prediction reference lists -> sacrebleu's reference streams (None = missing)."""
    k = max(len(r) for r in refs_per_pred)
    streams = [[r[i] if i < len(r) else None for r in refs_per_pred] for i in range(k)]
    return sacrebleu.corpus_bleu(preds, streams, tokenize=tokenize).score


@pytest.mark.parametrize("tokenize", ["13a", "none"])
def test_bleu_parity_random_and_real(tokenize):
    rng = random.Random(2024 if tokenize == "13a" else 2025)
    for trial in range(60):
        n = rng.choice([1, 2, 5, 20])
        if trial % 2:
            pairs = real_pairs(rng, n)
            preds = [p for p, _ in pairs]
            refs = [[r] + [perturb(rng, r) for _ in range(rng.randint(0, 2))] for _, r in pairs]
        else:
            preds = [random_text(rng) for _ in range(n)]
            refs = [[random_text(rng) for _ in range(rng.randint(1, 3))] for _ in range(n)]
            preds = [p + " " + r[0][:rng.randint(0, len(r[0]))] for p, r in zip(preds, refs)]
        ours = E.bleu(preds, refs, tokenize=tokenize)
        assert abs(ours - sacrebleu_score(preds, refs, tokenize)) < 1e-9
        if all(len(r) == 1 for r in refs):  # plain strings work too
            assert E.bleu(preds, [r[0] for r in refs], tokenize=tokenize) == ours


@pytest.mark.parametrize("preds,refs", [
    ([""], [["a b c"]]), (["", ""], [[""], ["a"]]), (["a b c"], [["a b c"]]),
    (["x y z w v"], [["a b c d e"]]), (["a b c d"], [["a b x d"]]),  # p3 = p4 = 0: two smoothings
    (["a b c d e", "f"], [["a b c d e"], ["f g h i j k l"]]),
    (["the cat ."], [["The cat."]]), (["-\nx"], [["x"]]),
    (["a b c d e-\n"], [["a b c d e f"]])])  # sacrebleu rstrips before undoing "-\n" hyphenation
def test_bleu_parity_degenerate(preds, refs):
    for tokenize in ("13a", "none"):
        assert abs(E.bleu(preds, refs, tokenize) - sacrebleu_score(preds, refs, tokenize)) < 1e-9


def test_13a_tokenizer_parity():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    theirs, rng = Tokenizer13a(), random.Random(8)
    for _ in range(500):
        text = random_text(rng).rstrip()
        assert E.tokenize_13a(text) == theirs(text).split()


# ----------------------------------------------------------------------------- distinct-n

def test_distinct_n_hand():
    preds = ["a b a", "a b"]
    # unigrams a b a a b: 2 unique / 5; bigrams (a b) (b a) (a b): 2 unique / 3
    assert E.distinct_n(preds, 1) == 2 / 5 and E.distinct_n(preds, 2) == 2 / 3
    # n-grams never cross predictions: "a" + "b" is not a bigram
    assert E.distinct_n(["a", "b"], 2) == 0.0
    assert E.distinct_n(["", "  "], 1) == 0.0 and E.distinct_n([], 1) == 0.0
    assert E.distinct_n(["x y z"], 3) == 1.0
    with pytest.raises(ValueError):
        E.distinct_n(["a"], 0)


# ----------------------------------------------------------------------------- no oracle imports

def test_evaluate_imports_only_allowed_modules():
    tree = ast.parse(open(os.path.join(REPO, "evaluate.py"), encoding="utf-8").read())
    names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for a in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    # the metrics are written from scratch: the oracles never appear; torch and the project's
    # model modules are imported only inside the perplexity command (a checkpoint needs them)
    assert not names & {"rouge_score", "sacrebleu", "nltk", "tokenizers", "transformers"}
    assert names <= {"argparse", "collections", "functools", "json", "math", "re", "numpy",
                     "torch", "data", "generate", "utils"}


# ----------------------------------------------------------------------------- CLI

def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "evaluate.py"), *args],
                          capture_output=True, text=True, timeout=60)


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_cli_rouge_and_bleu_json_match_functions(tmp_path):
    pairs = real_pairs(random.Random(3), 12)
    preds = [p.replace("\n", " ") for p, _ in pairs]
    refs = [r.replace("\n", " ") for _, r in pairs]
    p, r = write(tmp_path, "pred.txt", preds), write(tmp_path, "ref.txt", refs)
    out = run_cli("rouge", "--pred", p, "--ref", r, "--stem", "--json")
    assert out.returncode == 0, out.stderr
    assert _nested_close(json.loads(out.stdout), E.rouge(preds, refs, stem=True))
    out = run_cli("rouge", "--pred", p, "--ref", r, "--json", "--bootstrap", "50")
    assert out.returncode == 0 and _nested_close(
        json.loads(out.stdout), E.rouge_bootstrap(preds, refs, n_samples=50))
    out = run_cli("bleu", "--pred", p, "--ref", r, r, "--json")  # two (identical) reference files
    assert out.returncode == 0 and math.isclose(json.loads(out.stdout)["score"], E.bleu(preds, refs))
    out = run_cli("bleu", "--pred", p, "--ref", r, "--tokenize", "none")
    assert out.returncode == 0 and out.stdout.startswith(f"BLEU = {E.bleu(preds, refs, 'none'):.2f}")
    out = run_cli("distinct", "--pred", p, "--n", "1", "3", "--json")
    assert out.returncode == 0
    assert json.loads(out.stdout) == {f"distinct-{n}": E.distinct_n(preds, n) for n in (1, 3)}
    for extra in ([], ["--bootstrap", "20"]):  # the human-readable table
        out = run_cli("rouge", "--pred", p, "--ref", r, *extra)
        assert out.returncode == 0 and "rougeLsum" in out.stdout, out.stderr
    f1 = E.rouge(preds, refs)["rouge1"]["fmeasure"]
    assert "95% CI" in out.stdout and f"{100 * f1:7.2f}" in out.stdout


@pytest.mark.parametrize("stem", [False, True])
def test_cli_sent_sep_rouge_lsum_equals_rouge_scores_on_the_sentences(tmp_path, capsys, stem):
    """CNN/DM's files: one summary a line, its sentences joined by "<q>". With --sent_sep "<q>" every ROUGE equals
    rouge-score's on the same sentences one a line (its rougeLsum splits on newlines), ROUGE-Lsum included; without
    it a line is one sentence and ROUGE-Lsum is ROUGE-L."""
    pairs = real_pairs(random.Random(5), 30)
    sentences = [(p.split("\n"), r.split("\n")) for p, r in pairs]
    preds = [" <q> ".join(p) for p, _ in sentences]
    refs = ["<q>".join(r) for _, r in sentences]
    assert sum(len(r) > 1 for _, r in sentences) >= 5                          # multi-sentence summaries
    flags = ["rouge", "--pred", write(tmp_path, "pred.txt", preds), "--ref", write(tmp_path, "ref.txt", refs),
             "--json"] + (["--stem"] if stem else [])
    capsys.readouterr()
    E.main(flags + ["--sent_sep", "<q>"])
    ours = json.loads(capsys.readouterr().out)
    scorer = oracle_rouge(stem)
    theirs = [scorer.score("\n".join(r), "\n".join(p)) for p, r in sentences]
    for t in E.ROUGE_TYPES:
        for j, m in enumerate(MEASURES):
            assert abs(ours[t][m] - np.mean([s[t][j] for s in theirs])) <= 1e-12, (t, m)
    E.main(flags)
    one = json.loads(capsys.readouterr().out)
    assert one["rougeLsum"] == one["rougeL"] and ours["rougeLsum"] != ours["rougeL"]
    with pytest.raises(SystemExit):
        E.main(flags + ["--sent_sep", " "])
    assert "--sent_sep must be a visible separator" in capsys.readouterr().err


def _nested_close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_nested_close(a[k], b[k]) for k in a)
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-12)


def assert_one_line_error(out):
    """Exit status 2 and exactly one line on stderr, `evaluate.py: error: ...`, no traceback."""
    lines = out.stderr.strip().split("\n")
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("evaluate.py: error: "), out.stderr
    assert "Traceback" not in out.stderr


def test_cli_clean_errors(tmp_path):
    p = write(tmp_path, "pred.txt", ["a b", "c d", "e"])
    r = write(tmp_path, "ref.txt", ["a b", "c d"])
    for command in ("rouge", "bleu"):
        out = run_cli(command, "--pred", p, "--ref", r)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert "3 lines" in out.stderr and "2 lines" in out.stderr
        assert "pred.txt" in out.stderr and "ref.txt" in out.stderr
        assert_one_line_error(out)
    out = run_cli("rouge", "--pred", str(tmp_path / "missing.txt"), "--ref", r)
    assert out.returncode == 2 and "missing.txt" in out.stderr and "Traceback" not in out.stderr
    assert_one_line_error(out)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    out = run_cli("distinct", "--pred", str(bad))
    assert out.returncode == 2 and "UTF-8" in out.stderr and "Traceback" not in out.stderr
    assert_one_line_error(out)


def test_cli_bad_flags_one_line_exit_2(tmp_path):
    p = write(tmp_path, "pred.txt", ["a b", "c d"])
    empty = write(tmp_path, "empty.txt", [])
    data = write(tmp_path, "data.jsonl", [json.dumps({"src": "a b", "tgt": "a"})])
    cases = [
        (["rouge", "--pred", p, "--ref", p, "--bootstrap", "-1"], "--bootstrap"),
        (["rouge", "--pred", empty, "--ref", empty], "empty"),
        (["rouge", "--pred", str(tmp_path), "--ref", p], "directory"),
        (["lead", "--src", p, "--ref", p, "--words", "0"], "--words"),
        (["lead", "--src", p, "--ref", write(tmp_path, "one.txt", ["a"])], "one source per"),
        (["distinct", "--pred", p, "--n", "1", "0"], "--n"),
        (["bleu", "--pred", p, "--ref", p, str(tmp_path / "nope.txt")], "nope.txt"),
        (["perplexity", "--ckpt", str(tmp_path / "nope.pt"), "--data", data], "not found"),
        (["perplexity", "--ckpt", p, "--data", data, "--batch_size", "0"], "--batch_size"),
        (["perplexity", "--ckpt", p, "--data", data, "--device", "tpu"], "--device"),
        (["perplexity", "--ckpt", p, "--data", str(tmp_path / "nope.jsonl")], "nope"),
        (["perplexity", "--ckpt", p, "--data", data], "cannot read"),     # text, not a checkpoint
    ]
    # in parallel: the perplexity ones import torch
    procs = [subprocess.Popen([sys.executable, os.path.join(REPO, "evaluate.py"), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args, _ in cases]
    for (args, words), proc in zip(cases, procs):
        stdout, stderr = proc.communicate(timeout=120)
        assert_one_line_error(subprocess.CompletedProcess(args, proc.returncode, stdout, stderr))
        assert words in stderr and stdout == "", (args, stderr)


def test_cli_perplexity_refuses_a_malicious_checkpoint(tmp_path):
    """A checkpoint is data: a pickle that would run code is refused, one line, exit 2."""
    from tests.test_generate import save_exploit
    evil, marker = tmp_path / "evil.pt", tmp_path / "MARKER"
    save_exploit(evil, marker)
    data = write(tmp_path, "data.jsonl", [json.dumps({"src": "w1 w2", "tgt": "w3"})])
    out = run_cli("perplexity", "--ckpt", str(evil), "--data", data, "--device", "cpu")
    assert_one_line_error(out)
    assert "refused" in out.stderr and not marker.exists()


# ----------------------------------------------------------------------------- the line rule

# each line holds a '\r' that splits it into pieces of < 4 tokens: read with universal newlines,
# no 4-gram is left and BLEU is 0.0 (sacrebleu's own control-character case)
CR_LINES = ["a b c\rd e f", "g h\ri j k", "l m n\ro p q"]


def test_cli_carriage_return_inside_a_line_does_not_split_it(tmp_path):
    lf = tmp_path / "lf.txt"
    lf.write_bytes("".join(line + "\n" for line in CR_LINES).encode("utf-8"))
    crlf = tmp_path / "crlf.txt"                                      # Windows line endings
    crlf.write_bytes("".join(line + "\r\n" for line in CR_LINES).encode("utf-8"))
    # the answer: the texts scored against themselves, as sacrebleu scores them in memory
    assert sacrebleu_score(CR_LINES, [[t] for t in CR_LINES], "13a") == pytest.approx(100.0)
    for pred, ref in ((lf, lf), (lf, crlf), (crlf, crlf)):
        out = run_cli("bleu", "--pred", str(pred), "--ref", str(ref), "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["score"] == pytest.approx(100.0)
        assert json.loads(out.stdout)["sys_len"] == 6 + 5 + 6         # whole lines, no pieces
        out = run_cli("rouge", "--pred", str(pred), "--ref", str(ref), "--json")
        assert out.returncode == 0, out.stderr
        assert all(s[m] == 1.0 for s in json.loads(out.stdout).values() for m in MEASURES)
    # lines pair up one to one: the same words with a space for the '\r' score the same
    spaced = write(tmp_path, "spaced.txt", [t.replace("\r", " ") for t in CR_LINES])
    out = run_cli("bleu", "--pred", str(lf), "--ref", spaced, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["score"] == pytest.approx(100.0)
    out = run_cli("distinct", "--pred", str(crlf), "--n", "1", "--json")
    assert json.loads(out.stdout) == {"distinct-1": E.distinct_n(CR_LINES, 1)}


def test_cli_other_line_breaks_stay_inside_a_line(tmp_path):
    """U+2028, U+2029, \x0c, \x1c and \x85 are not line ends (str.splitlines says they are)."""
    texts = ["the cat\u2028sat", "on\x0cthe mat", "a\x1cdog\x85ran", "far\u2029away"]
    pred = write(tmp_path, "pred.txt", texts)
    ref = write(tmp_path, "ref.txt", [" ".join(t.split()) for t in texts])
    out = run_cli("rouge", "--pred", pred, "--ref", ref, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rouge1"]["fmeasure"] == 1.0


# ----------------------------------------------------------------------------- lead baseline

def test_lead_takes_the_first_words():
    source = " ".join(f"w{i}" for i in range(30))
    assert E.lead([source]) == [" ".join(f"w{i}" for i in range(12))]        # 12 by default
    assert E.lead([source, "  a\tb  c ", ""], n_words=2) == ["w0 w1", "a b", ""]
    assert E.lead(["short one"], n_words=12) == ["short one"]
    with pytest.raises(ValueError):
        E.lead(["a"], n_words=0)
    with pytest.raises(TypeError):
        E.lead("a b c")
    # a source that IS its reference (12 words or fewer): the lead baseline is perfect
    refs = ["the cat sat on the mat", "a dog ran far away quickly"]
    scores = E.rouge(E.lead(refs), refs)
    assert all(scores[t][m] == 1.0 for t in E.ROUGE_TYPES for m in MEASURES)
    # longer sources: only the first words count, so recall drops and precision stays 1
    long_src = [r + " and then many other words came" for r in refs]
    s = E.rouge(E.lead(long_src, n_words=6), refs)["rouge1"]
    assert s["precision"] == s["recall"] == 1.0
    s = E.rouge(E.lead(long_src, n_words=3), refs)["rouge1"]
    assert s["precision"] == 1.0 and s["recall"] == 0.5


def test_cli_lead_prints_what_rouge_prints(tmp_path):
    pairs = real_pairs(random.Random(21), 10)
    srcs = [p.replace("\n", " ") for p, _ in pairs]
    refs = [r.replace("\n", " ") for _, r in pairs]
    s, r = write(tmp_path, "test.src", srcs), write(tmp_path, "test.tgt", refs)
    for words in (12, 5):
        leads = write(tmp_path, f"lead{words}.txt", E.lead(srcs, words))
        for extra in ([], ["--stem"], ["--json"], ["--bootstrap", "20"]):
            flags = ["--words", str(words)] if words != 12 else []
            out = run_cli("lead", "--src", s, "--ref", r, *flags, *extra)
            want = run_cli("rouge", "--pred", leads, "--ref", r, *extra)
            assert out.returncode == want.returncode == 0, out.stderr + want.stderr
            assert out.stdout == want.stdout                   # the same numbers, the same table
    out = run_cli("lead", "--src", s, "--ref", r, "--words", "5", "--stem", "--json")
    assert _nested_close(json.loads(out.stdout), E.rouge(E.lead(srcs, 5), refs, stem=True))

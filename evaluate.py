"""evaluate.py -- ROUGE, BLEU-4 and distinct-n, written from scratch (docs/metrics.md tells more).

  * ROUGE-1/2/L/Lsum (Lin 2004), equal to Google's rouge-score 0.1.2 with its Porter stemmer
    (Porter 1980, NLTK's default mode: `porter_stem`); corpus BLEU-4 (Papineni et al. 2002) equal
    to sacrebleu 2.6.0's corpus_bleu defaults; distinct-n (Li et al. 2016); bootstrap intervals.
  * Commands rouge, lead, bleu, distinct, perplexity (`python evaluate.py -h`); files hold one text
    a line (rouge --sent_sep "<q>": the sentences of a multi-sentence summary, for ROUGE-Lsum);
    a bad flag or file is one line, `evaluate.py: error: ...`, exit status 2.
Left out: ROUGE-W/S/SU, multi-reference ROUGE, sacrebleu's other tokenizers and smoothings.
"""
import argparse
import collections
import functools
import json
import math
import re

import numpy as np

from utils import (UsageError, check_at_least, exit_with_error, one_line_warnings, pick_device,
                   read_lines)

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")

# ----------------------------------------------------------------------------- Porter stemmer
_VOWELS = frozenset("aeiou")
# NLTK's pool of irregular forms: they bypass the algorithm ("skies" -> "sky", "dying" -> "die").
_IRREGULAR = {"sky": "sky", "skies": "sky", "dying": "die", "lying": "lie", "tying": "tie",
              "news": "news", "innings": "inning", "inning": "inning", "outings": "outing",
              "outing": "outing", "cannings": "canning", "canning": "canning", "howe": "howe",
              "proceed": "proceed", "exceed": "exceed", "succeed": "succeed"}


def _consonant_flags(word):
    """True where word[i] is a consonant. Porter: 'y' is a consonant unless it follows one."""
    flags = []
    for i, ch in enumerate(word):
        if ch == "y":
            # "toy": y is a consonant; in "syzygy" the second one is not
            flags.append(i == 0 or not flags[-1])
        else:
            flags.append(ch not in _VOWELS)
    return flags


def _measure(stem):
    """m in the form [C](VC)^m[V]: the number of vowel -> consonant transitions."""
    flags = _consonant_flags(stem)
    return sum(1 for a, b in zip(flags, flags[1:]) if not a and b)


def _ends_double_consonant(word):  # condition *d
    return len(word) >= 2 and word[-1] == word[-2] and _consonant_flags(word)[-1]


def _ends_cvc(word):  # condition *o: consonant-vowel-consonant, the last not w, x or y
    flags = _consonant_flags(word)
    if len(word) >= 3:
        return flags[-3] and not flags[-2] and flags[-1] and word[-1] not in "wxy"
    # NLTK extension: a two-letter vowel-consonant stem counts too (so "ow" + "ing" -> "ow")
    return len(word) == 2 and not flags[0] and flags[1]


def _positive(stem):  # condition (m > 0)
    return _measure(stem) > 0


def _above_one(stem):  # condition (m > 1)
    return _measure(stem) > 1


def _apply_rules(word, rules):
    """Porter's rule lists: the FIRST rule whose suffix matches decides; if its condition fails
    the word stays ("rational": shorter suffixes are not tried)."""
    for suffix, replacement, condition in rules:
        if word.endswith(suffix):
            stem = word[:len(word) - len(suffix)]
            return stem + replacement if condition is None or condition(stem) else word
    return word


def _step1a(word):  # plurals
    if word.endswith("ies") and len(word) == 4:  # NLTK: "ties" -> "tie" but "flies" -> "fli"
        return word[:-1]
    return _apply_rules(word, [("sses", "ss", None), ("ies", "i", None), ("ss", "ss", None),
                               ("s", "", None)])


def _step1b(word):  # -ed / -ing
    if word.endswith("ied"):  # NLTK: "died" -> "die" but "spied" -> "spi"
        return word[:-3] + ("ie" if len(word) == 4 else "i")
    if word.endswith("eed"):  # (m>0) EED -> EE; when it fails ("feed") ED is NOT tried
        return word[:-1] if _positive(word[:-3]) else word
    for suffix in ("ed", "ing"):
        if word.endswith(suffix) and not all(_consonant_flags(word[:-len(suffix)])):  # *v*
            stem = word[:-len(suffix)]
            break
    else:
        return word
    # Tidy the stem so that step 2-4 can see -ATE, -BLE, -IZE again.
    if stem.endswith(("at", "bl", "iz")):
        return stem + "e"  # conflat(ed) -> conflate
    if _ends_double_consonant(stem):  # hopp(ing) -> hop, but fall(ing), hiss(ing), fizz(ed) keep it
        return stem if stem[-1] in "lsz" else stem[:-1]
    if _measure(stem) == 1 and _ends_cvc(stem):
        return stem + "e"  # fil(ing) -> file
    return stem


def _step1c(word):  # y -> i after a consonant (NLTK: and not when the stem is a single letter)
    return _apply_rules(word, [("y", "i", lambda s: len(s) > 1 and _consonant_flags(s)[-1])])


_STEP2 = [("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"),
          ("izer", "ize"), ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"),
          ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"), ("ator", "ate"), ("alism", "al"),
          ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"), ("aliti", "al"),
          ("iviti", "ive"), ("biliti", "ble"), ("fulli", "ful")]


def _step2(word):  # double suffixes -> single ones, (m>0)
    if word.endswith("alli") and _positive(word[:-4]):  # NLTK: ALLI -> AL first, then step 2 again
        return _step2(word[:-2])
    rules = [(s, r, _positive) for s, r in _STEP2]
    # NLTK: the 'l' of LOGI stays with the stem for the measure, so "geologi" -> "geolog"
    rules.append(("logi", "log", lambda s: _positive(s + "l")))
    return _apply_rules(word, rules)


def _step3(word):  # -ic-, -full, -ness etc., (m>0)
    return _apply_rules(word, [(s, r, _positive) for s, r in [
        ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
        ("ful", ""), ("ness", "")]])


def _step4(word):  # drop the last suffix when the stem is long enough, (m>1)
    rules = [(s, "", _above_one) for s in ("al", "ance", "ence", "er", "ic", "able", "ible",
                                           "ant", "ement", "ment", "ent")]
    rules.append(("ion", "", lambda s: _above_one(s) and s[-1] in "st"))  # adopt(ion) -> adopt
    rules += [(s, "", _above_one) for s in ("ou", "ism", "ate", "iti", "ous", "ive", "ize")]
    return _apply_rules(word, rules)


def _step5a(word):  # final e; both rules are tried (unlike _apply_rules)
    if word.endswith("e"):
        m = _measure(word[:-1])
        if m > 1 or (m == 1 and not _ends_cvc(word[:-1])):  # probat(e), ceas(e); "rate" stays
            return word[:-1]
    return word


def _step5b(word):  # controll -> control when (m>1) counts the first 'l'
    return word[:-1] if word.endswith("ll") and _above_one(word[:-1]) else word


@functools.lru_cache(maxsize=2**18)
def porter_stem(word):
    """Porter stem of one word, equal to nltk's PorterStemmer().stem(word)."""
    stem = word.lower()
    if stem in _IRREGULAR:
        return _IRREGULAR[stem]
    if len(word) <= 2:  # NLTK/Martin: one- and two-letter words are left alone
        return stem
    for step in (_step1a, _step1b, _step1c, _step2, _step3, _step4, _step5a, _step5b):
        stem = step(stem)
    return stem


# ----------------------------------------------------------------------------- ROUGE
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def rouge_tokenize(text, stem=False):
    """rouge-score's tokenizer: lowercase, anything but [a-z0-9] separates tokens, and (if stem)
    Porter-stem the tokens longer than 3 characters."""
    tokens = _NON_ALNUM.sub(" ", text.lower()).split()  # lower() first: "K" (Kelvin) -> "k"
    return [porter_stem(t) if stem and len(t) > 3 else t for t in tokens]


def _score(p, r):  # F is the harmonic mean of P and R, 0 when both are 0
    return {"precision": p, "recall": r, "fmeasure": 2 * p * r / (p + r) if p + r > 0 else 0.0}


def _ngrams(tokens, orders):
    """Counter of all n-grams (as tuples) of the given orders n."""
    return collections.Counter(tuple(tokens[i:i + n]) for n in orders
                               for i in range(len(tokens) - n + 1))


def _rouge_n(ref, pred, n):
    """ROUGE-N (Lin 2004, Eq. 1): overlap of n-gram counts, each clipped by the other side."""
    ref_grams = _ngrams(ref, [n])
    pred_grams = _ngrams(pred, [n])
    overlap = sum(min(count, pred_grams[g]) for g, count in ref_grams.items())
    # max(., 1): no n-grams on a side gives 0, not a division by zero (rouge-score's convention)
    return _score(overlap / max(sum(pred_grams.values()), 1),
                  overlap / max(sum(ref_grams.values()), 1))


def _lcs_table(a, b):
    """table[i][j] = length of the longest common subsequence of a[:i] and b[:j]."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        up, row = table[i - 1], table[i]
        for j in range(1, len(b) + 1):
            # a match extends the diagonal; otherwise keep the better of dropping a[i-1] or b[j-1]
            row[j] = up[j - 1] + 1 if a[i - 1] == b[j - 1] else max(up[j], row[j - 1])
    return table


def _rouge_l(ref, pred):
    """ROUGE-L (Lin 2004, Eq. 2-4): P = LCS/|pred|, R = LCS/|ref|; 0 if either text is empty."""
    if not ref or not pred:
        return _score(0.0, 0.0)
    lcs = _lcs_table(ref, pred)[-1][-1]
    return _score(lcs / len(pred), lcs / len(ref))


def lcs_alignment(reference, prediction):
    """ROUGE-L's longest common subsequence of two token lists -> (table, pairs): the LCS table
    (Lin 2004, Sec. 3.1) and ONE LCS [(i, j)] in order, by rouge-score's walk back (docs/metrics.md,
    "ROUGE-L's alignment": ROUGE-Lsum depends on which LCS)."""
    table = _lcs_table(reference, prediction)
    i, j = len(reference), len(prediction)
    pairs = []
    while i > 0 and j > 0:
        if reference[i - 1] == prediction[j - 1]:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif table[i][j - 1] > table[i - 1][j]:
            j -= 1
        else:
            i -= 1
    return table, pairs[::-1]


def _rouge_lsum(ref_sents, pred_sents):
    """Summary-level ROUGE-L (Lin 2004, Sec. 3.2, Eq. 5-7) on lists of tokenized sentences."""
    m = sum(map(len, ref_sents))
    n = sum(map(len, pred_sents))
    if m == 0 or n == 0:
        return _score(0.0, 0.0)
    # a token is credited at most as often as it occurs in each summary (ROUGE-1.5.5, rouge-score)
    budget_ref = collections.Counter(t for s in ref_sents for t in s)
    budget_pred = collections.Counter(t for s in pred_sents for t in s)
    hits = 0
    for ref in ref_sents:
        # union LCS: the ref positions that lie on the chosen LCS with ANY candidate sentence
        union = {i for cand in pred_sents for i, _ in lcs_alignment(ref, cand)[1]}
        for token in (ref[k] for k in union):  # (visiting order cannot change the count)
            if budget_ref[token] > 0 and budget_pred[token] > 0:
                hits += 1
                budget_ref[token] -= 1
                budget_pred[token] -= 1
    return _score(hits / n, hits / m)


def rouge_scores(prediction, reference, stem=False):
    """ROUGE-1/2/L/Lsum of one pair: {type: {"precision", "recall", "fmeasure"}}, each in [0, 1]."""
    pred = rouge_tokenize(prediction, stem)
    ref = rouge_tokenize(reference, stem)

    def sentences(text):  # Lsum's sentences are the non-empty lines of a text
        return [rouge_tokenize(s, stem) for s in text.split("\n") if s]

    return {"rouge1": _rouge_n(ref, pred, 1), "rouge2": _rouge_n(ref, pred, 2),
            "rougeL": _rouge_l(ref, pred),
            "rougeLsum": _rouge_lsum(sentences(reference), sentences(prediction))}


def _check_pairs(predictions, references):
    if isinstance(predictions, str) or isinstance(references, str):
        raise TypeError("predictions and references must be lists of texts, not one string")
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if len(predictions) == 0:
        raise ValueError("no predictions to score")


def _score_matrix(predictions, references, stem):
    """(N, 12) array: one row per pair, columns (type, measure) in ROUGE_TYPES x P/R/F order."""
    _check_pairs(predictions, references)
    rows = []
    for p, r in zip(predictions, references):
        s = rouge_scores(p, r, stem)
        rows.append([s[t][k] for t in ROUGE_TYPES for k in ("precision", "recall", "fmeasure")])
    return np.array(rows, dtype=np.float64)


def _unflatten(values):  # 12 numbers -> {type: {measure: value}}
    keys = ("precision", "recall", "fmeasure")
    return {t: {k: values[3 * i + j] for j, k in enumerate(keys)}
            for i, t in enumerate(ROUGE_TYPES)}


def rouge(predictions, references, stem=False):
    """Mean over pairs of ROUGE-1/2/L/Lsum precision, recall and F (each in [0, 1])."""
    return _unflatten([float(v) for v in _score_matrix(predictions, references, stem).mean(axis=0)])


def rouge_bootstrap(predictions, references, stem=False, n_samples=1000, seed=0, confidence=0.95):
    """Percentile-bootstrap CIs {type: {measure: {"mean", "low", "high"}}}: pairs resampled
    n_samples times, low/high the (1 -+ confidence)/2 percentiles of the resampled means."""
    if n_samples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need n_samples >= 1, 0 < confidence < 1; got {n_samples}, {confidence}")
    matrix = _score_matrix(predictions, references, stem)  # (N, 12)
    rng = np.random.default_rng(seed)
    n = len(matrix)
    means = np.stack([matrix[rng.integers(0, n, size=n)].mean(axis=0)
                      for _ in range(n_samples)])  # (n_samples, 12)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail], axis=0)  # each (12,)
    return _unflatten([{"mean": float(mu), "low": float(lo), "high": float(hi)}
                       for mu, lo, hi in zip(matrix.mean(axis=0), low, high)])


# ----------------------------------------------------------------------------- BLEU
# mteval-v13a's punctuation rules (sacrebleu's tokenizer_13a / tokenizer_re), applied in order.
_13A_RULES = [
    # split off every ASCII symbol except ' - . , : the ranges are { | } ~, [ \ ] ^ _ `,
    # space ! " # $ % &, ( ) * +, : ; < = > ? @, and /
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),  # period/comma not preceded by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),  # period/comma not followed by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # a dash after a digit ("1990-2000")
]


def tokenize_13a(line):
    """The WMT mteval-v13a tokenizer, as sacrebleu applies it; returns the tokens."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    for entity, char in (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">")):
        line = line.replace(entity, char)
    line = f" {line} "
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return line.split()


def _bleu_tokens(text, tokenize):
    if tokenize not in ("13a", "none"):
        raise ValueError(f"tokenize must be '13a' or 'none', got {tokenize!r}")
    text = text.rstrip()  # sacrebleu strips trailing whitespace before tokenizing
    return tokenize_13a(text) if tokenize == "13a" else text.split()


def _as_reference_lists(predictions, references):
    """Accept one reference string per prediction, or a list of references per prediction."""
    _check_pairs(predictions, references)
    lists = [[r] if isinstance(r, str) else list(r) for r in references]
    for i, refs in enumerate(lists):
        if not refs or not all(isinstance(r, str) for r in refs):
            raise TypeError(f"references[{i}] must be a string or a non-empty list of strings")
    return lists


def bleu_details(predictions, references, tokenize="13a"):
    """Corpus BLEU-4 and its parts: score (0-100), precisions (%), bp, sys_len, ref_len, counts."""
    correct = [0] * 4                      # matched n-grams of order 1..4
    total = [0] * 4                        # hypothesis n-grams of order 1..4
    sys_len = 0
    ref_len = 0
    for pred, refs in zip(predictions, _as_reference_lists(predictions, references)):
        hyp = _bleu_tokens(pred, tokenize)
        ref_tokens = [_bleu_tokens(r, tokenize) for r in refs]
        # clip each hypothesis n-gram by its largest count in any ONE reference (Counter | = max)
        clip = functools.reduce(collections.Counter.__or__,
                                (_ngrams(r, range(1, 5)) for r in ref_tokens))
        for gram, count in _ngrams(hyp, range(1, 5)).items():
            total[len(gram) - 1] += count
            correct[len(gram) - 1] += min(count, clip[gram])
        sys_len += len(hyp)
        # the reference length closest to the hypothesis length, the shorter one on ties
        lengths = sorted(len(r) for r in ref_tokens)        # min keeps the first of equals
        ref_len += min(lengths, key=lambda length: abs(length - len(hyp)))
    return bleu_from_stats(correct, total, sys_len, ref_len)


def bleu_from_stats(correct, total, sys_len, ref_len):
    """BLEU = BP * exp(mean_n log p_n) (Papineni et al. 2002, Sec. 2.3), sacrebleu's smoothing, from
    a corpus's summed statistics: matched and output n-grams of orders 1-4, output and reference
    lengths (bench/study.py resamples them for its intervals)."""
    # brevity penalty: exp(1 - r/c) when the system output is shorter than the references
    bp = 1.0 if sys_len >= ref_len else (math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0)
    precisions = [0.0] * 4
    details = {"precisions": precisions, "bp": bp, "sys_len": sys_len, "ref_len": ref_len,
               "counts": correct, "totals": total}
    if not any(correct):  # no match at all: BLEU is 0
        return {"score": 0.0, **details}
    smooth = 1.0
    for n in range(4):
        if total[n] == 0:  # no n-grams of this order at all: p_n stays 0 and BLEU becomes 0
            break
        if correct[n] == 0:
            # 'exp' (NIST) smoothing: the k-th zero precision becomes 1 / (2^k total)
            smooth *= 2
            precisions[n] = 100.0 / (smooth * total[n])
        else:
            precisions[n] = 100.0 * correct[n] / total[n]
    log_p = [math.log(p) if p > 0 else -9999999999 for p in precisions]  # sacrebleu floors log(0)
    return {"score": bp * math.exp(sum(log_p) / 4), **details}


def bleu(predictions, references, tokenize="13a"):
    """Corpus BLEU-4 in 0-100, equal to sacrebleu.corpus_bleu with its defaults."""
    return bleu_details(predictions, references, tokenize)["score"]


# ----------------------------------------------------------------------------- distinct-n
def distinct_n(predictions, n):
    """Unique n-grams / all n-grams over the corpus (whitespace tokens); 0.0 if there are none."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [tuple(tokens[i:i + n]) for tokens in (p.split() for p in predictions)
             for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


# ----------------------------------------------------------------------------- lead baseline
def lead(sources, n_words=12):
    """The lead baseline: the first n_words (whitespace-separated) words of each source."""
    if isinstance(sources, str):
        raise TypeError("sources must be a list of texts, not one string")
    if n_words < 1:
        raise ValueError(f"n_words must be >= 1, got {n_words}")
    return [" ".join(source.split()[:n_words]) for source in sources]


# ----------------------------------------------------------------------------- perplexity
def perplexity(model, objective, pairs, batch_size=32, max_tgt=128):
    """exp(mean negative log-likelihood per target token, the final [EOS] counted) of (src_ids,
    tgt_ids) pairs, teacher-forced through generate.py's loop: every objective is scored the way
    it generates. Targets beyond max_tgt (at most half the model's positions) and sources that do
    not fit are cut."""
    from generate import max_source_len, score_targets     # torch is needed only here
    eos = objective.tok.eos_id
    # a small model (max_position 128) keeps room for a source: [SOS] src [EOS] + target + [EOS]
    max_tgt = min(max_tgt, (model.config.max_position - 3) // 2)
    src_limit = max_source_len(model, max_tgt + 1)
    nll = 0.0
    n = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        sources = [list(s)[:src_limit] for s, _ in chunk]
        targets = [list(t)[:max_tgt] + [eos] for _, t in chunk]
        for logp in score_targets(model, objective, sources, targets):
            nll -= float(logp.sum())
            n += logp.numel()
    if n == 0:
        raise ValueError("perplexity: no target tokens to score")
    return math.exp(nll / n)


# ----------------------------------------------------------------------------- command line
PROG = "evaluate.py"


def _read_pairs(pred_path, ref_path, what="prediction"):
    """Two files of one text a line (utils.read_lines), paired line by line."""
    preds = read_lines(pred_path)
    refs = read_lines(ref_path)
    if len(preds) != len(refs):
        raise UsageError(f"{pred_path} has {len(preds)} lines but {ref_path} has {len(refs)} "
                         f"lines (one {what} per reference line)")
    if not preds:
        raise UsageError(f"{pred_path} is empty")
    return preds, refs


def _report_rouge(args, preds, refs):
    """ROUGE of the pairs (with bootstrap intervals if asked), printed as JSON or as a table."""
    result = (rouge_bootstrap(preds, refs, args.stem, n_samples=args.bootstrap) if args.bootstrap
              else rouge(preds, refs, args.stem))
    if args.json:
        return print(json.dumps(result, indent=2))
    print(f"{'':10}{'P':>7}{'R':>7}{'F':>7}   ({len(preds)} pairs, x100, stem={args.stem})")
    measures = ("precision", "recall", "fmeasure")
    for name, s in result.items():
        p, r, f = (s[k]["mean"] if args.bootstrap else s[k] for k in measures)
        f_ci = s["fmeasure"]
        ci = (f"   95% CI of F: [{100 * f_ci['low']:.2f}, {100 * f_ci['high']:.2f}]"
              if args.bootstrap else "")
        print(f"{name:10}{100 * p:7.2f}{100 * r:7.2f}{100 * f:7.2f}{ci}")


def split_sentences(texts, sep):
    """One text a line with its sentences joined by sep (CNN/DM's "<q>") -> the sentences on lines
    of their own, what ROUGE-Lsum reads (rouge_scores); ROUGE-1/2/L read the words either way."""
    return texts if sep is None else [text.replace(sep, "\n") for text in texts]


def _cmd_rouge(args):
    preds, refs = _read_pairs(args.pred, args.ref)
    _report_rouge(args, split_sentences(preds, args.sent_sep), split_sentences(refs, args.sent_sep))


def _cmd_lead(args):
    sources, refs = _read_pairs(args.src, args.ref, what="source")
    sources, refs = split_sentences(sources, args.sent_sep), split_sentences(refs, args.sent_sep)
    _report_rouge(args, lead(sources, args.words), refs)


def _cmd_bleu(args):
    preds = read_lines(args.pred)
    streams = [_read_pairs(args.pred, ref)[1] for ref in args.ref]
    result = bleu_details(preds, [list(refs) for refs in zip(*streams)], args.tokenize)
    if args.json:
        return print(json.dumps(result, indent=2))
    prec = "/".join(f"{p:.1f}" for p in result["precisions"])
    print(f"BLEU = {result['score']:.2f}  {prec}  (BP = {result['bp']:.3f}, "
          f"sys_len = {result['sys_len']}, ref_len = {result['ref_len']}, "
          f"tokenize = {args.tokenize})")


def _cmd_distinct(args):
    preds = read_lines(args.pred)
    result = {f"distinct-{n}": distinct_n(preds, n) for n in args.n}
    print(json.dumps(result, indent=2) if args.json
          else "\n".join(f"{name} = {value:.4f}" for name, value in result.items()))


def _cmd_perplexity(args):
    import torch
    import data
    from generate import load_checkpoint
    device = pick_device(args.device)
    # a DataError (the user's file is at fault) is a UsageError: one line, exit 2
    examples = data.read_seq2seq(args.data)
    # read as data (utils.read_checkpoint): a checkpoint that holds Python objects is refused
    model, tok, objective = load_checkpoint(args.ckpt, device)
    pairs = [(tok.encode(s), tok.encode(t)) for s, t in examples]
    with torch.no_grad():
        value = perplexity(model, objective, pairs, args.batch_size)
    print(json.dumps({"perplexity": value, "pairs": len(pairs)}) if args.json
          else f"perplexity {value:.3f} over {len(pairs)} pairs")


def _check_args(args):
    """The numbers argparse cannot check by type; a mistake is a UsageError (one line, exit 2)."""
    if getattr(args, "sent_sep", None) is not None and not args.sent_sep.strip():
        raise UsageError("--sent_sep must be a visible separator such as \"<q>\", not blank")
    if getattr(args, "n", None) and min(args.n) < 1:
        raise UsageError(f"--n must be >= 1, got {min(args.n)}")
    check_at_least(args, bootstrap=0, words=1, batch_size=1)


def _command(commands, name, run, help, flag, flag_help):
    """A subcommand that runs `run`: its first flag (what it reads) and --json."""
    sub = commands.add_parser(name, help=help)
    sub.set_defaults(run=run)
    sub.add_argument(flag, required=True, help=flag_help)
    sub.add_argument("--json", action="store_true", help="print the result as JSON")
    return sub


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    predictions = "predictions, one per line"
    rouge_cmd = _command(commands, "rouge", _cmd_rouge,
                         "ROUGE-1/2/L/Lsum (rouge-score 0.1.2 numbers)", "--pred", predictions)
    lead_cmd = _command(commands, "lead", _cmd_lead,
                        "ROUGE of the lead baseline: the first N source words", "--src",
                        "sources, one per line")
    lead_cmd.add_argument("--words", type=int, default=12, metavar="N", help="words kept (12)")
    # the flags `rouge` and `lead` share: both print through _report_rouge
    for sub in (rouge_cmd, lead_cmd):
        sub.add_argument("--ref", required=True, help="references, one per line")
        sub.add_argument("--stem", action="store_true", help="Porter-stem tokens of > 3 chars")
        sub.add_argument("--bootstrap", type=int, default=0, metavar="N",
                         help="add 95%% confidence intervals from N bootstrap resamples")
        sub.add_argument("--sent_sep", metavar="SEP",
                         help="the sentence separator inside a line (e.g. \"<q>\"): ROUGE-Lsum "
                              "over those sentences (without it a line is one sentence)")
    sub = _command(commands, "bleu", _cmd_bleu, "corpus BLEU-4 (sacrebleu defaults)", "--pred",
                   predictions)
    sub.add_argument("--ref", required=True, nargs="+", help="one or more reference files")
    sub.add_argument("--tokenize", choices=("13a", "none"), default="13a")
    sub = _command(commands, "distinct", _cmd_distinct, "distinct-n over all predictions", "--pred",
                   predictions)
    sub.add_argument("--n", type=int, nargs="+", default=[1, 2])
    sub = _command(commands, "perplexity", _cmd_perplexity,
                   "per-token perplexity of a checkpoint on a seq2seq file", "--ckpt",
                   "a train.py checkpoint (fine-tuned with --task seq2seq)")
    sub.add_argument("--data", required=True,
                     help="jsonl {src, tgt} or parallel files (data.read_seq2seq)")
    sub.add_argument("--batch_size", type=int, default=32)
    sub.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    try:
        _check_args(args)
        args.run(args)
    except UsageError as e:                          # DataError included: the user's to fix
        exit_with_error(PROG, e)


if __name__ == "__main__":
    one_line_warnings(PROG)
    main()

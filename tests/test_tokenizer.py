"""Tests for tokenizer.py: BERT's basic tokenizer by hand-checked examples, WordPiece encoding, the trainer
(against a naive full-recount trainer), files, errors, and token-for-token parity with HF `tokenizers`
(a test-only oracle) built from our own vocab.txt. Training corpus: CPython's pydoc_data.topics (~0.5 MB)."""
import collections
import functools
import math
import os
import pickle
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from pydoc_data.topics import topics

import tokenizer
from tokenizer import SPECIAL_TOKENS, WordPiece, basic_tokenize

# A little multilingual text so the vocabulary knows accents, CJK, Greek, Cyrillic, emoji (min_frequency 2).
MULTILINGUAL = ("Ünïcödé café naïve résumé Ærøskøbing 中文字符测试 日本語のテキスト ひらがな カタカナ 한국어 "
                "Ελληνικά γλώσσα Русский текст ÀÉÎÕÜ 😀🎉👍 ½ ° € £ ¥ « » — ¿ ¡ ，。") * 3
ROOT = Path(__file__).resolve().parent.parent
CORPUS = [topics[k] for k in sorted(topics)] + [MULTILINGUAL, "a lone ꙮ"]   # ꙮ: a char seen once


@functools.cache
def _train(lowercase):
    return WordPiece.train(CORPUS, 3000, lowercase=lowercase, progress=False)


@pytest.fixture(scope="module", params=[True, False], ids=["lowercase", "cased"])
def trained(request):
    return _train(request.param)


@pytest.fixture(scope="module")
def wp():             # (named so as not to shadow conftest's `tok`)
    return _train(True)


# --- BERT's basic tokenizer, hand-checked -------------------------------------------------------------

@pytest.mark.parametrize("text, lower, cased", [
    ("Héllo Wörld", ["hello", "world"], ["Héllo", "Wörld"]),                # NFD + drop Mn only when lowercasing
    ("e\u0301te\u0301", ["ete"], ["e\u0301te\u0301"]),                        # combining accents
    ("İstanbul ẞ", ["istanbul", "ß"], ["İstanbul", "ẞ"]),
    ("ΟΔΟΣ", ["οδος"], ["ΟΔΟΣ"]),                                            # str.lower(): final sigma, as BERT
    ("ab中文cd", ["ab", "中", "文", "cd"], ["ab", "中", "文", "cd"]),            # CJK ideographs are spaced
    ("a\U0002b820b", ["a", "\U0002b820", "b"], ["a", "\U0002b820", "b"]),   # BERT's range (HF: from 2B920)
    ("ひらがなカナ한국어", ["ひらかなカナ" + unicodedata.normalize("NFD", "한국어")],  # kana/hangul: not spaced;
     ["ひらがなカナ한국어"]),                                                 # NFD drops が's mark, splits hangul
    ("a$b^c`d|e~f", list("a$b^c`d|e~f"), list("a$b^c`d|e~f")),               # ASCII symbols count as punctuation
    ("«hi»—yes¿no…", ["«", "hi", "»", "—", "yes", "¿", "no", "…"], ["«", "hi", "»", "—", "yes", "¿", "no", "…"]),
    ("5€ 3+4=7", ["5€", "3", "+", "4", "=", "7"], ["5€", "3", "+", "4", "=", "7"]),   # € is Sc: not punctuation
    ("a\x00b\ufffdc\u200bd\x7fe", ["abcde"], ["abcde"]),                       # control/format chars dropped
    ("a\tb\nc\r\nd\u00a0e\u3000f\u2028g", list("abcdefg"), list("abcdefg")),  # all kinds of whitespace
    ("don't", ["don", "'", "t"], ["don", "'", "t"]),
    ("", [], []),
])
def test_basic_tokenize_matches_bert(text, lower, cased):
    assert basic_tokenize(text, lowercase=True) == lower
    assert basic_tokenize(text, lowercase=False) == cased


# --- WordPiece encoding on a hand-made vocabulary (BERT's own unit-test vocabulary) -----------------

def _hand_vocab():
    return WordPiece(list(SPECIAL_TOKENS) + ["want", "##want", "##ed", "wa", "un", "runn", "##ing", ",",
                                             "a", "##a"])


def test_greedy_longest_match_first():
    wp = _hand_vocab()
    assert wp.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert wp.tokenize("UNwanted, running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert wp.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]    # no full cover -> whole word UNK
    assert wp.tokenize("wanted") == ["want", "##ed"]                         # longest first, not "wa"
    assert wp.tokenize("") == []


def test_long_words_become_unk():
    wp = _hand_vocab()
    assert wp.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert wp.tokenize("a" * 101) == ["[UNK]"]
    assert wp.encode("a" * 101 + " a") == [wp.unk_id, wp.token_to_id("a")]


def test_special_tokens_ids_and_aliases(wp):
    assert wp.vocab[:7] == list(SPECIAL_TOKENS)
    assert (wp.pad_id, wp.unk_id, wp.sos_id, wp.eos_id, wp.mask_id, wp.pseudo_id, wp.attn_id) == tuple(range(7))
    assert wp.token_to_id("[CLS]") == wp.cls_id == wp.sos_id
    assert wp.token_to_id("[SEP]") == wp.sep_id == wp.eos_id
    assert "[CLS]" not in wp.vocab and "[SEP]" not in wp.vocab
    assert wp.special_ids == set(range(7))
    assert wp.id_to_token(wp.mask_id) == "[MASK]" and wp.token_to_id("nope-not-a-token") is None
    pieces = wp.tokenize("[MASK]")                                        # plain text: no special parsing
    assert pieces[0] == "[" and pieces[-1] == "]" and wp.mask_id not in wp.encode("[MASK]")


# --- training ---------------------------------------------------------------------------------------

def test_train_size_alphabet_and_coverage(wp):
    assert len(wp) == 3000 and len(set(wp.vocab)) == 3000
    counts = collections.Counter(w for t in CORPUS for w in basic_tokenize(t))
    kept = [w for w, n in counts.items() if n >= 2]
    assert all(wp.unk_id not in wp.encode(w) for w in kept)              # every kept word is coverable
    assert {"中", "😀", "##у", "—"} <= set(wp.vocab) and "##中" not in wp.vocab
    chars = collections.Counter(c for w, n in counts.items() for c in w for _ in range(n))
    rare = [c for c, n in chars.items() if n < 2]
    assert "ꙮ" in rare
    for c in rare:                                                         # chars seen once are left out
        assert c not in wp.vocab and wp.encode(c) == [wp.unk_id]
    assert wp.tokenize("the function returns") == ["the", "function", "returns"]


def test_train_is_deterministic(wp):
    shuffled = CORPUS[:]
    random.Random(1).shuffle(shuffled)                                     # text order does not matter either
    assert WordPiece.train(shuffled, 3000, progress=False).vocab == wp.vocab


def test_train_ignores_hash_seed():
    code = ("import sys; sys.path[:0] = ['.', 'tests']; import test_tokenizer as t; "
            "print(t.WordPiece.train(t.CORPUS[:8], 800, progress=False).fingerprint())")
    runs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout for seed in ("1", "2")}
    assert runs == {WordPiece.train(CORPUS[:8], 800, progress=False).fingerprint() + "\n"}


def _naive_train(texts, n_pieces, criterion):
    """Reference trainer: recount everything from scratch before every merge."""
    counts = collections.Counter(w for t in texts for w in basic_tokenize(t))
    names = tokenizer._alphabet(counts, 2)
    ids = {s: i for i, s in enumerate(names)}
    words = [([w[0]] + ["##" + c for c in w[1:]], n) for w, n in sorted(counts.items()) if n >= 2]
    n0 = sum(len(w) * n for w, n in words)
    while len(names) < n_pieces:
        sym, pair = collections.Counter(), collections.Counter()
        for w, n in words:
            for s in w:
                sym[s] += n
            for p in zip(w, w[1:]):
                pair[p] += n
        if not pair:
            break

        def key(p):
            c, ca, cb = pair[p], sym[p[0]], sym[p[1]]
            score = c / (ca * cb) if criterion == "ratio" else c * (math.log(c * n0 / (ca * cb)) - 1)
            return (-score, -c, ids[p[0]], ids[p[1]])
        a, b = min(pair, key=key)
        new = a + b[2:]
        if new not in ids:
            ids[new] = len(names)
            names.append(new)
        for w, _ in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [new]
                i += 1
    return names


@pytest.mark.parametrize("criterion", ["likelihood", "ratio"])
def test_incremental_trainer_equals_full_recount(criterion):
    texts = [topics["if"], topics["while"], topics["for"], topics["try"], MULTILINGUAL]
    fast = WordPiece.train(texts, 450, criterion=criterion, progress=False)
    assert fast.vocab[7:] == _naive_train(texts, 450 - 7, criterion)


def test_likelihood_beats_ratio_on_pieces_per_word():
    text = CORPUS[:40]
    words = [w for t in CORPUS[40:] for w in basic_tokenize(t)]
    ppw = {}
    for criterion in ("likelihood", "ratio"):
        wp = WordPiece.train(text, 1500, criterion=criterion, progress=False)
        ppw[criterion] = sum(len(wp._encode_word(w)) for w in words) / len(words)
    assert ppw["likelihood"] < 0.8 * ppw["ratio"], ppw


# --- decode and round trips ---------------------------------------------------------------------------

def test_decode_tidies_and_skips(wp):
    ids = wp.encode("Hello, world! It's (really) an x-ray; 50% [ok].")
    assert wp.decode(ids) == "hello, world! it's (really) an x-ray; 50% [ok]."
    padded = [wp.sos_id] + ids + [wp.eos_id, wp.pad_id, wp.pad_id]
    assert wp.decode(padded) == "[SOS] " + wp.decode(ids) + " [EOS]"
    assert wp.decode(padded, skip_special=True) == wp.decode(ids)
    assert wp.decode([]) == ""
    for bad in (len(wp), -1):
        with pytest.raises(ValueError, match=f"id {bad} is out of range for a vocabulary of 3000"):
            wp.decode([5, bad])
    for text in ["the value of x is (at most) 3.5, isn't it?", "see the built-in list (page 3); or don't [sic]."]:
        assert wp.decode(wp.encode(text)) == text                        # normalized text survives intact


def test_round_trip_on_corpus_text(trained):
    lines = [ln for t in CORPUS[::7] for ln in t.splitlines() if ln.strip()]
    checked = 0
    for line in lines:
        ids = trained.encode(line)
        if trained.unk_id in ids:
            continue
        assert trained.tokenize(trained.decode(ids)) == trained.tokenize(line), line
        checked += 1
    assert checked > 200


# --- files --------------------------------------------------------------------------------------------

def test_save_load_identity(trained, tmp_path):
    path = tmp_path / "vocab.txt"
    trained.save(path)
    assert path.read_text(encoding="utf-8").split("\n")[:-1] == trained.vocab
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.txt"]            # no temp file left behind
    loaded = WordPiece.from_file(path, lowercase=trained.lowercase)
    assert loaded.vocab == trained.vocab and len(loaded) == len(trained)
    assert loaded.fingerprint() == trained.fingerprint()
    text = CORPUS[3][:5000] + MULTILINGUAL
    assert loaded.encode(text) == trained.encode(text)
    clone = pickle.loads(pickle.dumps(loaded))                             # DataLoader workers pickle it
    assert clone.vocab == loaded.vocab and clone.encode(text) == loaded.encode(text)


def test_fingerprint_notices_changes(wp):
    assert WordPiece(wp.vocab, lowercase=False).fingerprint() != wp.fingerprint()
    assert WordPiece(wp.vocab[:-1], lowercase=True).fingerprint() != wp.fingerprint()
    assert WordPiece(list(wp.vocab), lowercase=True).fingerprint() == wp.fingerprint()


# --- parity with HF tokenizers (test-only oracle) --------------------------------------------------

HAND_PICKED = [
    "Héllo, Wörld! Ünïcödé café naïve résumé — «quoted» ¿qué? ¡sí!",
    "中文字符测试，日本語のテキスト。한국어 ひらがな カタカナ mixed中文English",
    "Emoji 😀🎉👍 and ZWJ 👩\u200d💻 family, flags 🇫🇷 and skin 👍🏽",
    "ctrl\x00chars\x01here\x7f\ufffd and\u200bzero\u200dwidth\ufeffbom \x0b\x0c\x1c\x85",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u3000ideographic\u2028line\u2029para",
    "ASCII symbols $100 ^caret `tick` |pipe| ~tilde {brace} [bracket] <angle> @at #hash &amp; *star* _under_",
    "Ελληνικά γλώσσα Русский текст ÀÉÎÕÜ Ærøskøbing İstanbul ẞ straße ﬁ ½ ° € £ ¥",
    "combining e\u0301 a\u0308 n\u0303 and stacked o\u0302\u0323 marks",
    "a" * 100 + " " + "a" * 101 + " " + "supercalifragilisticexpialidocious" * 4,
    "def f(x): return x**2 + 3.14e-10  # comment; see https://docs.python.org/3/ (v3.11)",
    "UNK words: ⨌⨍ qwzxv ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0001F9EC",
    "",
]


# The first/last ideographs of BERT's CJK ranges, then neighbours outside them (Yi, hexagram, Kangxi radical,
# CJK extension F) that must NOT be spaced. U+2B820-2B91F is left out: HF's range starts at 0x2B920 (a typo
# for BERT's 0x2B820); test_basic_tokenize_matches_bert checks BERT's range.
CJK_EDGES = ("\u4e00\u9fff\u3400\u4dbf\uf900\ufad9\U00020000\U0002a6df\U0002a700\U0002b738\U0002b740"
             "\U0002b81d\U0002b920\U0002cea1\U0002f800\U0002fa1d" "\u33ff\ua000\u4dc0\u2fd5\U0002ceb0\U0002ebe0")


def _random_texts(n, seed=0):
    """Random strings over a pool that stresses every branch of the basic tokenizer. Left out: capital
    sigma (final-sigma lowercasing differs, see tokenizer.py) and unassigned code points (HF keeps them)."""
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 3 +
            " " * 40 + "\t\n\r\x00\x01\x7f\x85\u200b\u200d\ufeff\ufffd\u00a0\u3000\u2028" +
            "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "«»—–…¿¡“”‘’·•§¶†‡" + "€£¥°½±×÷∑√∞≈≠" +
            "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿÀÉÎÕÜÇÑßẞİıŁł" + "\u0301\u0308\u0303\u0327" + "हिन्दी\u20dd" +   # Mn; Mc and Me marks stay
            "αβγδεζηθικλμνξοπρσςτυφχψωΑΒΓΔΘΛΠΦΩ" + "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГД" +
            "中文字符测试日本語国语言你好世界" + "ひらがなカタカナ한국어" + "😀🎉👍🏽🇫🇷🧬" + CJK_EDGES)
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 120))) for _ in range(n)]


def test_parity_with_hf_bert_wordpiece(trained, tmp_path):
    from tokenizers import BertWordPieceTokenizer
    path = tmp_path / "vocab.txt"
    trained.save(path)
    lc = trained.lowercase
    hf = BertWordPieceTokenizer(str(path), clean_text=True, handle_chinese_chars=True, strip_accents=lc,
                                lowercase=lc, unk_token="[UNK]", cls_token="[SOS]", sep_token="[EOS]",
                                pad_token="[PAD]", mask_token="[MASK]")
    texts = HAND_PICKED + [ln for t in CORPUS[::5] for ln in t.splitlines()][:400] + _random_texts(400)
    for text in texts:
        assert trained.tokenize(text) == hf.encode(text, add_special_tokens=False).tokens, repr(text)
    ids = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    assert ids == [trained.encode(t) for t in texts]
    assert sum(trained.unk_id in i for i in ids) < len(texts) // 2          # the vocab really covers the text


# --- bad input ----------------------------------------------------------------------------------------

def test_bad_inputs(wp, tmp_path):
    for bad in (None, b"bytes", 3, ["a list"]):
        with pytest.raises(TypeError, match="expected text as a str"):
            wp.encode(bad)
        with pytest.raises(TypeError, match="expected text as a str"):
            wp.tokenize(bad)
    with pytest.raises(TypeError, match="iterable of strings"):
        WordPiece.train("one string", 100)
    with pytest.raises(ValueError, match="nothing to train on"):
        WordPiece.train([], 100, progress=False)
    with pytest.raises(ValueError, match=r"min_frequency=2 .*\(3 distinct words"):
        WordPiece.train(["only hapax words"], 100, progress=False)
    with pytest.raises(ValueError, match=r"vocab_size=9 is too small: .* needs 3 pieces \+ 7 .* = 10"):
        WordPiece.train(["ab ab"], 9, progress=False)                      # alphabet: a b ##b
    with pytest.raises(ValueError, match="criterion"):
        WordPiece.train(["ab ab"], 100, criterion="bpe", progress=False)


def test_bad_vocab_files(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        WordPiece.from_file(missing)
    good = list(SPECIAL_TOKENS) + ["a", "b"]
    cases = {"empty.txt": (good[:3] + [""] + good[3:], r"empty.txt:4: empty token"),
             "dup.txt": (good + ["a"], r"dup.txt:10: duplicate token 'a' \(first on line 8\)"),
             "nospecial.txt": (good[:4] + good[7:], r"nospecial.txt: missing required special tokens "
                                                    r"\['\[MASK\]', '\[P\]', '\[ATTN\]'\]")}
    for name, (lines, message) in cases.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            WordPiece.from_file(tmp_path / name)
    (tmp_path / "latin1.txt").write_bytes("\n".join(good + ["caf\xe9"]).encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt:10: not UTF-8"):
        WordPiece.from_file(tmp_path / "latin1.txt")
    (tmp_path / "ok.txt").write_text("\n".join(good) + "\n", encoding="utf-8")
    assert WordPiece.from_file(tmp_path / "ok.txt").vocab == good

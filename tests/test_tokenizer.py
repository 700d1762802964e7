"""Tests for tokenizer.py: BERT's basic tokenizer by hand-checked examples, WordPiece encoding, the
trainer (the incremental one against the naive full recount), files (ours and BERT's vocab.txt),
errors, and token-for-token parity with HF `tokenizers` (a test-only oracle) built from our own
vocab.txt and from a BERT-format vocab.txt that HF's trainer made. Training corpus: CPython's
pydoc_data.topics (~0.5 MB)."""
import ast
import collections
import functools
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
import utils
from tokenizer import SPECIAL_TOKENS, WordPiece, basic_tokenize

# A little multilingual text so the vocabulary knows accents, CJK, Greek, Cyrillic, emoji
# (min_frequency 2).
MULTILINGUAL = ("Ünïcödé café naïve résumé Ærøskøbing 中文字符测试 日本語のテキスト ひらがな カタカナ 한국어 "
                "Ελληνικά γλώσσα Русский текст ÀÉÎÕÜ 😀🎉👍 ½ ° € £ ¥ « » — ¿ ¡ ，。") * 3
ROOT = Path(__file__).resolve().parent.parent
# ꙮ: a char seen once
CORPUS = [topics[k] for k in sorted(topics)] + [MULTILINGUAL, "a lone ꙮ"]


@functools.cache
def _train(lowercase):
    return WordPiece.train(CORPUS, 3000, lowercase=lowercase, progress=False)


@pytest.fixture(scope="module", params=[True, False], ids=["lowercase", "cased"])
def trained(request):
    return _train(request.param)


@pytest.fixture(scope="module")
def wp():             # (named so as not to shadow conftest's `tok`)
    return _train(True)


# --- BERT's basic tokenizer, hand-checked ---------------------------------------------------------

@pytest.mark.parametrize("text, lower, cased", [
    # NFD + drop Mn only when lowercasing
    ("Héllo Wörld", ["hello", "world"], ["Héllo", "Wörld"]),
    ("e\u0301te\u0301", ["ete"], ["e\u0301te\u0301"]),                  # combining accents
    ("İstanbul ẞ", ["istanbul", "ß"], ["İstanbul", "ẞ"]),
    ("ΟΔΟΣ", ["οδος"], ["ΟΔΟΣ"]),                      # str.lower(): final sigma, as BERT
    ("ab中文cd", ["ab", "中", "文", "cd"], ["ab", "中", "文", "cd"]),      # CJK ideographs are spaced
    # BERT's range (HF: from 2B920)
    ("a\U0002b820b", ["a", "\U0002b820", "b"], ["a", "\U0002b820", "b"]),
    # kana/hangul: not spaced; NFD drops が's mark, splits hangul
    ("ひらがなカナ한국어", ["ひらかなカナ" + unicodedata.normalize("NFD", "한국어")],
     ["ひらがなカナ한국어"]),
    # ASCII symbols count as punctuation
    ("a$b^c`d|e~f", list("a$b^c`d|e~f"), list("a$b^c`d|e~f")),
    ("«hi»—yes¿no…", ["«", "hi", "»", "—", "yes", "¿", "no", "…"],
     ["«", "hi", "»", "—", "yes", "¿", "no", "…"]),
    # € is Sc: not punctuation
    ("5€ 3+4=7", ["5€", "3", "+", "4", "=", "7"], ["5€", "3", "+", "4", "=", "7"]),
    # control/format chars dropped
    ("a\x00b\ufffdc\u200bd\x7fe", ["abcde"], ["abcde"]),
    # all kinds of whitespace
    ("a\tb\nc\r\nd\u00a0e\u3000f\u2028g", list("abcdefg"), list("abcdefg")),
    ("don't", ["don", "'", "t"], ["don", "'", "t"]),
    ("", [], []),
])
def test_basic_tokenize_matches_bert(text, lower, cased):
    assert basic_tokenize(text, lowercase=True) == lower
    assert basic_tokenize(text, lowercase=False) == cased


# --- WordPiece encoding on a hand-made vocabulary (BERT's own unit-test vocabulary) ---------------

def _hand_vocab():
    return WordPiece(list(SPECIAL_TOKENS) + ["want", "##want", "##ed", "wa", "un", "runn", "##ing",
                                             ",", "a", "##a"])


def test_greedy_longest_match_first():
    wp = _hand_vocab()
    assert wp.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert wp.tokenize("UNwanted, running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    # no full cover -> whole word UNK
    assert wp.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
    assert wp.tokenize("wanted") == ["want", "##ed"]                     # longest first, not "wa"
    assert wp.tokenize("") == []


def test_long_words_become_unk():
    wp = _hand_vocab()
    assert wp.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert wp.tokenize("a" * 101) == ["[UNK]"]
    assert wp.encode("a" * 101 + " a") == [wp.unk_id, wp.token_to_id("a")]


def test_special_tokens_ids_and_aliases(wp):
    assert wp.vocab[:7] == list(SPECIAL_TOKENS)
    ids = (wp.pad_id, wp.unk_id, wp.sos_id, wp.eos_id, wp.mask_id, wp.pseudo_id, wp.attn_id)
    assert ids == tuple(range(7))
    assert wp.token_to_id("[CLS]") == wp.cls_id == wp.sos_id
    assert wp.token_to_id("[SEP]") == wp.sep_id == wp.eos_id
    assert "[CLS]" not in wp.vocab and "[SEP]" not in wp.vocab
    assert wp.special_ids == set(range(7))
    assert wp.id_to_token(wp.mask_id) == "[MASK]" and wp.token_to_id("nope-not-a-token") is None
    pieces = wp.tokenize("[MASK]")                              # plain text: no special parsing
    assert pieces[0] == "[" and pieces[-1] == "]" and wp.mask_id not in wp.encode("[MASK]")


# --- training -------------------------------------------------------------------------------------

def test_train_size_alphabet_and_coverage(wp):
    assert len(wp) == 3000 and len(set(wp.vocab)) == 3000
    counts = collections.Counter(w for t in CORPUS for w in basic_tokenize(t))
    kept = [w for w, n in counts.items() if n >= 2]
    assert all(wp.unk_id not in wp.encode(w) for w in kept)          # every kept word is coverable
    assert {"中", "😀", "##у", "—"} <= set(wp.vocab) and "##中" not in wp.vocab
    chars = collections.Counter(c for w, n in counts.items() for c in w for _ in range(n))
    rare = [c for c, n in chars.items() if n < 2]
    assert "ꙮ" in rare
    for c in rare:                                               # chars seen once are left out
        assert c not in wp.vocab and wp.encode(c) == [wp.unk_id]
    assert wp.tokenize("the function returns") == ["the", "function", "returns"]


def test_train_is_deterministic(wp):
    shuffled = CORPUS[:]
    random.Random(1).shuffle(shuffled)                         # text order does not matter either
    assert WordPiece.train(shuffled, 3000, progress=False).vocab == wp.vocab


def test_train_ignores_hash_seed():
    code = ("import sys; sys.path[:0] = ['.', 'tests']; import test_tokenizer as t; "
            "print(t.WordPiece.train(t.CORPUS[:8], 800, progress=False).fingerprint())")
    runs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout
            for seed in ("1", "2")}
    assert runs == {WordPiece.train(CORPUS[:8], 800, progress=False).fingerprint() + "\n"}


@pytest.mark.parametrize("train", [tokenizer._train_pieces_naive, tokenizer._train_pieces],
                         ids=["naive", "incremental"])
def test_trainers_by_hand(train):
    # "ab" 10 times, "cd" twice, "e" 200 times: N = 20 + 4 + 200 = 224 symbols at the start
    counts = {"ab": 10, "cd": 2, "e": 200}
    alphabet = ["a", "b", "c", "d", "e", "##b", "##d"]
    # likelihood: ab gains 10 (log(10*224 / (10*10)) - 1) = 21.1,
    # cd only 2 (log(2*224 / (2*2)) - 1) = 7.4
    assert train(counts, 8, 1, "likelihood") == alphabet + ["ab"]
    # ratio: ab scores 10 / (10*10) = 0.1, cd 2 / (2*2) = 0.5: the rare pair first
    assert train(counts, 8, 1, "ratio") == alphabet + ["cd"]
    # once every word is one symbol there is nothing left to merge: fewer pieces than asked for
    assert train(counts, 20, 1, "likelihood") == alphabet + ["ab", "cd"]
    # a tie in score and count goes to the older symbols: (a, ##b) before (c, ##d)
    assert train({"ab": 2, "cd": 2}, 7, 1, "likelihood") == alphabet[:4] + ["##b", "##d", "ab"]
    assert train({"cd": 2, "ab": 2}, 7, 1, "ratio") == alphabet[:4] + ["##b", "##d", "ab"]


@pytest.mark.parametrize("criterion", ["likelihood", "ratio"])
def test_incremental_trainer_equals_naive(criterion):
    texts = [topics["if"], topics["while"], topics["for"], topics["try"], MULTILINGUAL]
    fast = WordPiece.train(texts, 450, criterion=criterion, progress=False)
    naive = WordPiece.train(texts, 450, criterion=criterion, progress=False, method="naive")
    assert fast.vocab == naive.vocab                                   # same pieces, same order
    counts = collections.Counter(w for t in texts for w in basic_tokenize(t))
    assert fast.vocab[7:] == tokenizer._train_pieces_naive(counts, 450 - 7, 2, criterion)
    # and on more text, where thousands of words compete
    more = CORPUS[:40]
    fast = WordPiece.train(more, 1200, criterion=criterion, progress=False)
    assert fast.vocab == WordPiece.train(more, 1200, criterion=criterion, progress=False,
                                         method="naive").vocab


def test_likelihood_beats_ratio_on_pieces_per_word():
    text = CORPUS[:40]
    words = [w for t in CORPUS[40:] for w in basic_tokenize(t)]
    ppw = {}
    for criterion in ("likelihood", "ratio"):
        wp = WordPiece.train(text, 1500, criterion=criterion, progress=False)
        ppw[criterion] = sum(len(wp._encode_word(w)) for w in words) / len(words)
    assert ppw["likelihood"] < 0.8 * ppw["ratio"], ppw


# --- decode and round trips -----------------------------------------------------------------------

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
    for text in ["the value of x is (at most) 3.5, isn't it?",
                 "see the built-in list (page 3); or don't [sic]."]:
        assert wp.decode(wp.encode(text)) == text                # normalized text survives intact


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


# --- files ----------------------------------------------------------------------------------------

def test_save_load_identity(trained, tmp_path):
    path = tmp_path / "vocab.txt"
    trained.save(path)
    assert path.read_text(encoding="utf-8").split("\n")[:-1] == trained.vocab
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.txt"]        # no temp file left behind
    loaded = WordPiece.from_file(path, lowercase=trained.lowercase)
    assert loaded.vocab == trained.vocab and len(loaded) == len(trained)
    assert loaded.fingerprint() == trained.fingerprint()
    text = CORPUS[3][:5000] + MULTILINGUAL
    assert loaded.encode(text) == trained.encode(text)
    clone = pickle.loads(pickle.dumps(loaded))                   # DataLoader workers pickle it
    assert clone.vocab == loaded.vocab and clone.encode(text) == loaded.encode(text)


def test_save_goes_through_utils_atomic_write(wp, tmp_path, monkeypatch):
    written = []
    real = utils.atomic_write

    def spy(path, content):
        written.append(path)
        real(path, content)
    monkeypatch.setattr(utils, "atomic_write", spy)
    path = tmp_path / "new" / "folder" / "vocab.txt"                   # atomic_write makes folders
    wp.save(path)
    assert written == [path]
    assert path.read_bytes() == "".join(t + "\n" for t in wp.vocab).encode("utf-8")   # \n only
    assert [p.name for p in path.parent.iterdir()] == ["vocab.txt"]


def test_fingerprint_notices_changes(wp):
    assert WordPiece(wp.vocab, lowercase=False).fingerprint() != wp.fingerprint()
    assert WordPiece(wp.vocab[:-1], lowercase=True).fingerprint() != wp.fingerprint()
    assert WordPiece(list(wp.vocab), lowercase=True).fingerprint() == wp.fingerprint()


# --- BERT's vocab.txt -----------------------------------------------------------------------------

# BERT's layout: [PAD], [unused0..98], [UNK] [CLS] [SEP] [MASK] (ids 100-103), more [unusedN]
BERT_SPECIALS = (["[PAD]"] + [f"[unused{i}]" for i in range(99)]
                 + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"[unused{i}]" for i in range(99, 104)])


@pytest.fixture(scope="module")
def bert_vocab(corpus_docs, tmp_path_factory):
    """(vocab.txt in BERT's format made by HF's WordPiece trainer, that HF tokenizer, held-out
    texts): trained on 250 documents of the embedded corpus, the rest held out."""
    from tokenizers import BertWordPieceTokenizer
    hf = BertWordPieceTokenizer(lowercase=True)
    train = [d.text for d in corpus_docs[:250]]
    hf.train_from_iterator(train, vocab_size=3000, min_frequency=2, special_tokens=BERT_SPECIALS,
                           show_progress=False)
    folder = tmp_path_factory.mktemp("bert")
    hf.save_model(str(folder))
    return folder / "vocab.txt", hf, [d.text for d in corpus_docs[250:]]


def test_bert_vocab_txt_from_hf_trainer(bert_vocab, tmp_path, capsys):
    path, hf, held_out = bert_vocab
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    assert lines[:104] == BERT_SPECIALS[:104] and len(lines) == 3000      # really BERT's layout
    wp = WordPiece.from_file(path)
    # the mapping is said once, on stderr
    assert capsys.readouterr().err == (f"{path}: BERT format: [SOS]=[CLS] (101), "
                                       "[EOS]=[SEP] (102), [P] -> [unused0] (id 1), "
                                       "[ATTN] -> [unused1] (id 2)\n")
    ids = (wp.pad_id, wp.pseudo_id, wp.attn_id, wp.unk_id, wp.sos_id, wp.eos_id, wp.mask_id)
    assert ids == (0, 1, 2, 100, 101, 102, 103)
    assert wp.sos_id == wp.cls_id == wp.token_to_id("[SOS]") == wp.token_to_id("[CLS]") == 101
    assert wp.eos_id == wp.sep_id == wp.token_to_id("[EOS]") == wp.token_to_id("[SEP]") == 102
    assert wp.token_to_id("[P]") == 1 and wp.token_to_id("[ATTN]") == 2
    assert wp.special_ids == {0, 1, 2, 100, 101, 102, 103}
    assert max(wp.special_ids) + 1 == 104               # objectives draw random ids after [MASK]
    # the two slots are renamed, every other line keeps its id
    assert wp.id_to_token(1) == "[P]" and wp.id_to_token(2) == "[ATTN]"
    assert wp.token_to_id("[unused0]") is None and wp.id_to_token(3) == "[unused2]"
    assert len(wp) == 3000 and wp.vocab[3:] == lines[3:] and wp.vocab[0] == lines[0]
    assert all(wp.token_to_id(t) == hf.token_to_id(t) for t in lines[3:])
    # encoding = the HF tokenizer's, on held-out documents and on the hard cases
    texts = held_out + HAND_PICKED + _random_texts(200)
    for text in texts:
        assert wp.encode(text) == hf.encode(text, add_special_tokens=False).ids, repr(text[:200])
    assert sum(len(wp.encode(t)) for t in held_out) > 20_000
    # save writes the renamed list; loading it again gives the same ids (said once more)
    wp.save(tmp_path / "vocab.txt")
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1] == wp.vocab
    again = WordPiece.from_file(tmp_path / "vocab.txt")
    assert capsys.readouterr().err == (f"{tmp_path / 'vocab.txt'}: BERT format: [SOS]=[CLS] (101), "
                                       "[EOS]=[SEP] (102)\n")
    # as does the constructor, which a checkpoint's vocab list goes through (silently)
    for other in (again, WordPiece(wp.vocab, lowercase=True)):
        assert other.vocab == wp.vocab and other.fingerprint() == wp.fingerprint()
        assert other.special_ids == wp.special_ids
        assert (other.sos_id, other.eos_id, other.pseudo_id, other.attn_id) == (101, 102, 1, 2)
        assert other.encode(held_out[0]) == wp.encode(held_out[0])
    assert capsys.readouterr().err == ""


def test_bert_vocab_txt_without_unused_slots(tmp_path, capsys):
    lines = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat", "."]
    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    wp = WordPiece.from_file(path)
    assert capsys.readouterr().err == (f"{path}: BERT format: [SOS]=[CLS] (2), [EOS]=[SEP] (3), "
                                       "[P] appended (id 10), [ATTN] appended (id 11)\n")
    assert wp.vocab == lines + ["[P]", "[ATTN]"]
    ids = (wp.pad_id, wp.unk_id, wp.sos_id, wp.eos_id, wp.mask_id, wp.pseudo_id, wp.attn_id)
    assert ids == (0, 1, 2, 3, 4, 10, 11) and wp.special_ids == set(ids)
    assert (wp.cls_id, wp.sep_id, wp.token_to_id("[SOS]"), wp.token_to_id("[EOS]")) == (2, 3, 2, 3)
    assert wp.encode("The cats sat.") == [5, 6, 7, 8, 9]
    assert wp.decode([2, 5, 6, 7, 10, 3], skip_special=True) == "the cats"
    wp.save(tmp_path / "saved.txt")
    again = WordPiece.from_file(tmp_path / "saved.txt")
    assert again.vocab == wp.vocab and again.special_ids == wp.special_ids
    # one free slot: [P] takes it, [ATTN] goes at the end
    path.write_text("\n".join(lines[:5] + ["[unused7]"] + lines[5:]) + "\n", encoding="utf-8")
    capsys.readouterr()
    wp = WordPiece.from_file(path)
    assert capsys.readouterr().err.endswith("[P] -> [unused7] (id 5), [ATTN] appended (id 11)\n")
    assert (wp.pseudo_id, wp.attn_id, wp.vocab[5], len(wp)) == (5, 11, "[P]", 12)
    # BERT's file must still hold its own five
    path.write_text("\n".join(lines[:4] + lines[5:]) + "\n", encoding="utf-8")
    with pytest.raises(utils.DataError, match=r"tiny.txt: missing required special tokens "
                                              r"\['\[MASK\]'\] .* a BERT one holds"):
        WordPiece.from_file(path)


def test_decode_joins_contractions_as_the_reference_decoder():
    """The case of the tokenizers library's own suite (bindings/python/tests/bindings/
    test_decoders.py, TestWordPiece.test_decoding, cleanup on), written out here, then the other
    contractions its cleanup joins, checked against that library's decoder (a test-only oracle)."""
    from tokenizers import decoders
    cases = [(["My", "na", "##me", "is", "Jo", "##hn"], "My name is John"),
             (["I", "'m", "Jo", "##hn"], "I'm John")]
    more = [["do", "n't", "go"], ["it", "'s", "we", "'ve", "they", "'re", "."], ["I", "'m", "."]]
    vocab = sorted({p for pieces, _ in cases for p in pieces} | {p for ps in more for p in ps})
    wp = WordPiece(list(SPECIAL_TOKENS) + vocab, lowercase=False)
    decode = lambda pieces: wp.decode([wp.token_to_id(p) for p in pieces])
    for pieces, text in cases:
        assert decode(pieces) == text
    for pieces in more:
        assert decode(pieces) == decoders.WordPiece().decode(pieces), pieces
    # a quoted piece is no contraction
    quoted = WordPiece(list(SPECIAL_TOKENS) + ["a", "'n'", "b"])
    assert quoted.decode([quoted.token_to_id(p) for p in ("a", "'n'", "b")]) == "a 'n' b"


# --- parity with HF tokenizers (test-only oracle) -------------------------------------------------

HAND_PICKED = [
    "Héllo, Wörld! Ünïcödé café naïve résumé — «quoted» ¿qué? ¡sí!",
    "中文字符测试，日本語のテキスト。한국어 ひらがな カタカナ mixed中文English",
    "Emoji 😀🎉👍 and ZWJ 👩\u200d💻 family, flags 🇫🇷 and skin 👍🏽",
    "ctrl\x00chars\x01here\x7f\ufffd and\u200bzero\u200dwidth\ufeffbom \x0b\x0c\x1c\x85",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u3000ideographic\u2028line\u2029para",
    "ASCII symbols $100 ^caret `tick` |pipe| ~tilde {brace} [bracket] <angle> @at #hash &amp; "
    "*star* _under_",
    "Ελληνικά γλώσσα Русский текст ÀÉÎÕÜ Ærøskøbing İstanbul ẞ straße ﬁ ½ ° € £ ¥",
    "combining e\u0301 a\u0308 n\u0303 and stacked o\u0302\u0323 marks",
    "a" * 100 + " " + "a" * 101 + " " + "supercalifragilisticexpialidocious" * 4,
    "def f(x): return x**2 + 3.14e-10  # comment; see https://docs.python.org/3/ (v3.11)",
    "UNK words: ⨌⨍ qwzxv ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0001F9EC",
    "",
]


# The first/last ideographs of BERT's CJK ranges, then neighbours outside them (Yi, hexagram, Kangxi
# radical, CJK extension F) that must NOT be spaced. U+2B820-2B91F is left out: HF's range starts at
# 0x2B920 (a typo for BERT's 0x2B820); test_basic_tokenize_matches_bert checks BERT's range.
CJK_EDGES = ("\u4e00\u9fff\u3400\u4dbf\uf900\ufad9\U00020000\U0002a6df\U0002a700\U0002b738"
             "\U0002b740\U0002b81d\U0002b920\U0002cea1\U0002f800\U0002fa1d"
             "\u33ff\ua000\u4dc0\u2fd5\U0002ceb0\U0002ebe0")


def _random_texts(n, seed=0):
    """Random strings over a pool that stresses every branch of the basic tokenizer. Left out:
    capital sigma (final-sigma lowercasing differs, see tokenizer.py) and unassigned code points
    (HF keeps them)."""
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 3 +
            " " * 40 + "\t\n\r\x00\x01\x7f\x85\u200b\u200d\ufeff\ufffd\u00a0\u3000\u2028" +
            "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "«»—–…¿¡“”‘’·•§¶†‡" + "€£¥°½±×÷∑√∞≈≠" +
            "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿÀÉÎÕÜÇÑßẞİıŁł" + "\u0301\u0308\u0303\u0327" +
            "हिन्दी\u20dd" +   # Mn; Mc and Me marks stay
            "αβγδεζηθικλμνξοπρσςτυφχψωΑΒΓΔΘΛΠΦΩ" + "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГД" +
            "中文字符测试日本語国语言你好世界" + "ひらがなカタカナ한국어" + "😀🎉👍🏽🇫🇷🧬" + CJK_EDGES)
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 120))) for _ in range(n)]


def test_parity_with_hf_bert_wordpiece(trained, tmp_path):
    from tokenizers import BertWordPieceTokenizer
    path = tmp_path / "vocab.txt"
    trained.save(path)
    lc = trained.lowercase
    hf = BertWordPieceTokenizer(str(path), clean_text=True, handle_chinese_chars=True,
                                strip_accents=lc, lowercase=lc, unk_token="[UNK]",
                                cls_token="[SOS]", sep_token="[EOS]", pad_token="[PAD]",
                                mask_token="[MASK]")
    lines = [ln for t in CORPUS[::5] for ln in t.splitlines()][:400]
    texts = HAND_PICKED + lines + _random_texts(400)
    for text in texts:
        hf_tokens = hf.encode(text, add_special_tokens=False).tokens
        assert trained.tokenize(text) == hf_tokens, repr(text)
    ids = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    assert ids == [trained.encode(t) for t in texts]
    # the vocab really covers the text
    assert sum(trained.unk_id in i for i in ids) < len(texts) // 2


# --- bad input ------------------------------------------------------------------------------------

def test_bad_inputs(wp, tmp_path):
    for bad in (None, b"bytes", 3, ["a list"]):
        with pytest.raises(TypeError, match="expected text as a str"):
            wp.encode(bad)
        with pytest.raises(TypeError, match="expected text as a str"):
            wp.tokenize(bad)
    with pytest.raises(TypeError, match="iterable of strings"):
        WordPiece.train("one string", 100)
    with pytest.raises(utils.DataError, match="nothing to train on"):
        WordPiece.train([], 100, progress=False)
    with pytest.raises(utils.DataError, match=r"min_frequency=2 .*\(3 distinct words"):
        WordPiece.train(["only hapax words"], 100, progress=False)
    with pytest.raises(utils.DataError,
                       match=r"vocab_size=9 is too small: .* needs 3 pieces \+ 7 .* = 10"):
        WordPiece.train(["ab ab"], 9, progress=False)                  # alphabet: a b ##b
    with pytest.raises(ValueError, match="criterion"):
        WordPiece.train(["ab ab"], 100, criterion="bpe", progress=False)
    with pytest.raises(ValueError, match=r"method='heap'; choose 'incremental' or 'naive'"):
        WordPiece.train(["ab ab"], 100, method="heap", progress=False)


def test_bad_vocab_files(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        WordPiece.from_file(missing)
    good = list(SPECIAL_TOKENS) + ["a", "b"]
    cases = {"empty.txt": (good[:3] + [""] + good[3:], r"empty.txt:4: empty token"),
             "dup.txt": (good + ["a"], r"dup.txt:10: duplicate token 'a' \(first on line 8\)"),
             "nospecial.txt": (good[:4] + good[7:],
                               r"nospecial.txt: missing required special tokens "
                               r"\['\[MASK\]', '\[P\]', '\[ATTN\]'\]")}
    for name, (lines, message) in cases.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        with pytest.raises(utils.DataError, match=message):
            WordPiece.from_file(tmp_path / name)
    (tmp_path / "latin1.txt").write_bytes("\n".join(good + ["caf\xe9"]).encode("latin-1"))
    with pytest.raises(utils.DataError, match=r"latin1.txt:10: not UTF-8"):
        WordPiece.from_file(tmp_path / "latin1.txt")
    (tmp_path / "ok.txt").write_text("\n".join(good) + "\n", encoding="utf-8")
    assert WordPiece.from_file(tmp_path / "ok.txt").vocab == good
    # Windows line ends and a byte-order mark are read as the same file
    (tmp_path / "crlf.txt").write_bytes(("\ufeff" + "\r\n".join(good) + "\r\n").encode("utf-8"))
    assert WordPiece.from_file(tmp_path / "crlf.txt").vocab == good


# --- style ----------------------------------------------------------------------------------------

def test_tokenizer_source_style():
    """tokenizer.py keeps lines within 100 characters and has no packed parallel assignments
    (a, b, c = x, y, z) where separate lines read better."""
    source = (ROOT / "tokenizer.py").read_text(encoding="utf-8")
    long_lines = [n for n, line in enumerate(source.split("\n"), 1) if len(line) > 100]
    assert long_lines == []
    packed = [node.lineno for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
              and (len(node.targets[0].elts) > 2 or isinstance(node.value, ast.Tuple))]
    assert packed == []

"""A from-scratch WordPiece tokenizer: BERT's basic tokenizer, a likelihood trainer, vocab.txt.

Three parts, the same three as BERT's `tokenization.py` plus the trainer it never published:

1. `basic_tokenize(text, lowercase)` -- BERT's BasicTokenizer, faithfully: drop control characters
   (Unicode category C*, except tab/newline/CR which count as whitespace), U+0000 and U+FFFD; put
   spaces around CJK ideographs (BERT's exact code-point ranges); when lowercasing, lowercase then
   strip accents (NFD, drop non-spacing marks Mn); split on whitespace and on punctuation (Unicode
   P* plus the ASCII symbols 33-47, 58-64, 91-96, 123-126 such as "$", "^", "`"). One `regex` pass
   does both splits.
2. WordPiece encoding (BERT's WordpieceTokenizer): greedy longest-match-first, pieces after the
   first carry "##"; a word longer than 100 characters, or one the vocabulary cannot fully cover,
   becomes [UNK]. Words are cached in a dict, so frequent words cost one lookup.
3. `WordPiece.train` -- WordPiece (Schuster & Nakajima 2012; BERT's vocabulary): start from
   characters ("##c" inside words) and repeatedly merge the adjacent pair (a, b) whose new piece
   "ab" most increases the likelihood of the training words under a unigram model of the pieces.
   To first order that gain is (criterion="likelihood")
       gain(a, b) = count(ab) * (log(count(ab) * N / (count(a) * count(b))) - 1)
   with N the number of symbols (held at its starting value so a score depends on three counts
   only). The popular shortcut  ratio(a, b) = count(ab) / (count(a) * count(b))  (criterion="ratio",
   e.g. the Hugging Face course) drops the count(ab) weight: it merges rare pairs first and never
   gets to "th"+"##e" (in bench/bench_tokenizer.py it needs 1.9x-2.7x more pieces per word), so it
   is not the default.
   Naive first, fast beside it. `_train_pieces_naive` (method="naive") is that definition run as
   written: before every merge, count every symbol and pair in every word from scratch, take the
   best pair, rewrite every word. Each merge is a pass over all the distinct words.
   `_train_pieces` (method="incremental", the default) makes the same merges in the same order
   (the tests hold the two equal): it remembers which words hold each pair, so a merge revisits
   only those words and updates only the counts that change, and a heap hands it the best pair.
   On pydoc's topics (0.5 MB, 3,356 distinct words) 350 merges take 2.9 s naive, 0.15 s
   incremental; an 8,192-piece vocabulary of the 2 MB embedded corpus takes 3 s incremental.

Decisions worth knowing:
- min_frequency applies to WORDS: a word seen fewer than `min_frequency` times is left out of the
  merge statistics (rare words are where the score is most easily fooled: two symbols seen once,
  together, look like a perfect unit). The alphabet keeps every character that occurs at least
  `min_frequency` times in the whole corpus (so it covers every kept word), as a plain piece, plus
  its "##" form if it was seen inside a word. Rarer characters encode as [UNK].
- Special tokens [PAD] [UNK] [SOS] [EOS] [MASK] [P] [ATTN] have ids 0..6 in a trained vocabulary;
  [CLS]/[SEP] are aliases of [SOS]/[EOS] (no lines of their own). `encode` treats its input as
  plain text: "[MASK]" in a string is three tokens "[", "mask", "]"; objectives insert special ids
  themselves.
- `from_file` also reads BERT's own vocab.txt, keeping every BERT id: there [CLS]/[SEP] serve as
  [SOS]/[EOS], and [P]/[ATTN], which BERT lacks, take the first [unusedN] slots (or go at the end
  of a file without them). It reports the mapping on stderr; see `_adopt_bert`.
- Known differences from HF `tokenizers` (the test oracle), all three on BERT's side: we
  lowercase with Python's `str.lower()` as BERT does (final sigma: "ΟΔΟΣ" -> "οδος"; HF gives
  "οδοσ"); we drop unassigned code points (Cn) as BERT does (HF keeps them); CJK Extension E starts
  at U+2B820 as in BERT (HF's table says 0x2B920). Unicode categories come from the `regex`
  module's tables.

Run:  python -c "import tokenizer; tok = tokenizer.WordPiece.train(['some text ...'], 1000)"
Left out: byte fallback, NFKC, offsets/alignment, batch encoding, special-token parsing, truncation.
"""
import collections
import hashlib
import heapq
import math
import sys
import unicodedata

import regex
from tqdm import tqdm

import utils

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[SOS]", "[EOS]", "[MASK]", "[P]", "[ATTN]")   # ids 0..6
# BERT's names for [SOS]/[EOS]. Either name finds the same id: in our vocabulary [CLS]/[SEP] are
# aliases of [SOS]/[EOS]; in BERT's, which has no [SOS]/[EOS], it is the other way round.
BERT_NAMES = {"[SOS]": "[CLS]", "[EOS]": "[SEP]"}
BERT_LACKS = ("[P]", "[ATTN]")   # special tokens that `from_file` adds to BERT's vocab.txt
PREFIX = "##"                 # marks a piece that continues a word
MAX_WORD_CHARS = 100          # BERT's max_input_chars_per_word: longer words become [UNK]
CACHE_WORDS = 1 << 18         # size bound of the per-instance word cache

# -------------------------------------------------------------------------------------------------
# 1. Basic tokenizer (BERT's BasicTokenizer)

# Category C* (Cc control, Cf format, Cs surrogate, Co private use, Cn unassigned) but not \t \n \r,
# plus U+FFFD. (\x00 is Cc.) V1 enables the set difference "--".
_CONTROL = regex.compile(r"[[\p{C}\uFFFD]--[\t\n\r]]", regex.V1)
# BERT's _is_chinese_char ranges: CJK Unified Ideographs and extensions A-E, compatibility
# ideographs.
_CJK = regex.compile("([\u4E00-\u9FFF\u3400-\u4DBF\U00020000-\U0002A6DF\U0002A700-\U0002B73F"
                     "\U0002B740-\U0002B81F\U0002B820-\U0002CEAF\uF900-\uFAFF"
                     "\U0002F800-\U0002FA1F])")
_PUNCT = r"\p{P}!-/:-@\[-`{-~"                       # BERT's _is_punctuation
# A word is one punctuation character or a maximal run of anything but punctuation and whitespace.
# (After _CONTROL, the whitespace left is space, \t \n \r, Zs, and U+2028/2029, which BERT's
# str.split() also splits on.)
_WORD = regex.compile(rf"[{_PUNCT}]|[^{_PUNCT}\s]+")
_NONSPACING_MARK = regex.compile(r"\p{Mn}+")


def basic_tokenize(text, lowercase=True):
    """BERT's basic tokenization of `text` into words and punctuation marks, e.g.
    "Héllo, 世界!" -> ["hello", ",", "世", "界", "!"] (lowercase=True)."""
    if not isinstance(text, str):
        raise TypeError(f"expected text as a str, got {type(text).__name__}: {text!r:.80}")
    text = _CONTROL.sub("", text)
    text = _CJK.sub(r" \1 ", text)
    if lowercase:   # BERT: lower() then strip accents = NFD and drop the combining marks
        text = _NONSPACING_MARK.sub("", unicodedata.normalize("NFD", text.lower()))
    return _WORD.findall(text)


# -------------------------------------------------------------------------------------------------
# 2. The tokenizer

class WordPiece:
    """A WordPiece vocabulary with BERT's encoding. Build it with `train` or `from_file`.

    `vocab` is the list of tokens, id = position. It must hold every special token, [SOS]/[EOS]
    either by that name or by BERT's [CLS]/[SEP] (a list that `from_file` made from BERT's file)."""

    def __init__(self, vocab, lowercase=True):
        self.vocab = list(vocab)
        self.lowercase = lowercase
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        # Either name of [SOS]/[EOS] finds the id of the one the vocabulary has
        for ours, bert in BERT_NAMES.items():
            if ours in self._ids:
                self._ids.setdefault(bert, self._ids[ours])
            elif bert in self._ids:
                self._ids[ours] = self._ids[bert]
        missing = [t for t in SPECIAL_TOKENS if t not in self._ids]
        if missing or len(set(self.vocab)) != len(self.vocab):
            raise ValueError(f"vocabulary lacks special tokens {missing} or has duplicates")
        self.pad_id = self._ids["[PAD]"]
        self.unk_id = self._ids["[UNK]"]
        self.sos_id = self._ids["[SOS]"]
        self.eos_id = self._ids["[EOS]"]
        self.mask_id = self._ids["[MASK]"]
        self.pseudo_id = self._ids["[P]"]
        self.attn_id = self._ids["[ATTN]"]
        self.cls_id = self.sos_id
        self.sep_id = self.eos_id
        # Objectives draw random tokens from max(special_ids)+1 .. len-1. For a trained vocabulary
        # that is every piece; for BERT's file it is the ids after [MASK] (103): the [unusedN]
        # slots below it are never drawn, which is fine. (A BERT file without [unusedN] slots gets
        # [P]/[ATTN] appended at the end, which leaves that range empty.)
        self.special_ids = {self._ids[t] for t in SPECIAL_TOKENS}
        # Longest piece in characters (without "##"): the greedy search never tries longer ones.
        self._max_piece = max(len(t.removeprefix(PREFIX)) for t in self.vocab)
        # word -> piece ids; a plain dict so that the tokenizer pickles (DataLoader workers)
        self._cache = {}

    def __len__(self):
        return len(self.vocab)

    def __repr__(self):
        return f"WordPiece(vocab_size={len(self)}, lowercase={self.lowercase})"

    def token_to_id(self, token):
        """Id of `token`; None if absent. [SOS]/[EOS] and [CLS]/[SEP] give the same ids."""
        return self._ids.get(token)

    def id_to_token(self, i):
        return self.vocab[i]

    # -- encoding ---------------------------------------------------------------------------------
    def _wordpiece(self, word):
        """Greedy longest-match-first split of one word into piece ids (BERT's
        WordpieceTokenizer)."""
        if len(word) > MAX_WORD_CHARS:
            return (self.unk_id,)
        ids = []
        start = 0
        while start < len(word):
            for end in range(min(len(word), start + self._max_piece), start, -1):
                piece = word[start:end] if start == 0 else PREFIX + word[start:end]
                i = self._ids.get(piece)
                if i is not None:
                    ids.append(i)
                    start = end
                    break
            else:   # no piece covers word[start:]: the whole word is unknown
                return (self.unk_id,)
        return tuple(ids)

    def _encode_word(self, word):
        pieces = self._cache.get(word)
        if pieces is None:
            if len(self._cache) >= CACHE_WORDS:     # crude bound on memory: start over
                self._cache.clear()
            pieces = self._cache[word] = self._wordpiece(word)
        return pieces

    def encode(self, text):
        """Text -> list of piece ids. No special tokens are added, and none are parsed from text."""
        ids = []
        for word in basic_tokenize(text, self.lowercase):
            ids.extend(self._encode_word(word))
        return ids

    def tokenize(self, text):
        """Text -> list of piece strings, e.g. "Unaffable" -> ["un", "##aff", "##able"]."""
        return [self.vocab[i] for i in self.encode(text)]

    def decode(self, ids, skip_special=False):
        """Piece ids -> text. "##" pieces are glued to the previous piece, [PAD] is always dropped
        (and all special tokens with skip_special=True), then spaces are tidied: none before
        . , ; : ! ? % ) ] }, none after ( [ {, none around . , : between digits ("3 . 5" -> "3.5")
        or an apostrophe or hyphen between letters/digits ("it ' s" -> "it's", "x - ray" ->
        "x-ray"), none before a contraction piece ("I 'm" -> "I'm", "do n't" -> "don't").
        Lowercasing, stripped accents and the exact original spacing cannot be undone."""
        drop = self.special_ids if skip_special else {self.pad_id}
        words = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"id {i} is out of range for a vocabulary of "
                                 f"{len(self.vocab)} tokens")
            if i in drop:
                continue
            tok = self.vocab[i]
            if tok.startswith(PREFIX) and words:
                words[-1] += tok[len(PREFIX):]
            else:
                words.append(tok)
        return _tidy(" ".join(words))

    # -- files ------------------------------------------------------------------------------------
    def save(self, vocab_txt):
        """Write BERT's vocab.txt format (one token a line, id = line number), atomically.
        A vocabulary read from BERT's file is written as renamed ([P]/[ATTN] in their slots)."""
        utils.atomic_write(vocab_txt, "".join(tok + "\n" for tok in self.vocab))

    @classmethod
    def from_file(cls, vocab_txt, lowercase=True):
        """Load a vocab.txt: ours, or BERT's (adapted by `_adopt_bert`, which is said on stderr).
        Errors name the file and the line: not UTF-8, empty line, duplicate token, missing
        specials (utils.DataError, a ValueError); a missing file raises FileNotFoundError."""
        with open(vocab_txt, "rb") as f:                # FileNotFoundError names the path
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            message = f"{vocab_txt}:{line}: not UTF-8 (byte offset {e.start})"
            raise utils.DataError(message) from None
        seen = {}
        for n, tok in enumerate(utils.split_lines(text.removeprefix("\ufeff")), start=1):
            if not tok.strip():
                raise utils.DataError(f"{vocab_txt}:{n}: empty token line")
            if tok in seen:
                raise utils.DataError(f"{vocab_txt}:{n}: duplicate token {tok!r} "
                                      f"(first on line {seen[tok]})")
            seen[tok] = n
        # A file that names [CLS] and not [SOS] is BERT's: it has no [P]/[ATTN] yet
        bert = "[CLS]" in seen and "[SOS]" not in seen
        needed = [t for t in SPECIAL_TOKENS if not (bert and t in BERT_LACKS)]
        missing = [t for t in needed if t not in seen and BERT_NAMES.get(t) not in seen]
        if missing:
            raise utils.DataError(f"{vocab_txt}: missing required special tokens {missing} "
                                  f"(a unigen vocab.txt starts with {' '.join(SPECIAL_TOKENS)}; "
                                  f"a BERT one holds [PAD] [UNK] [CLS] [SEP] [MASK])")
        tokens = list(seen)
        if bert:
            tokens, notes = _adopt_bert(tokens)
            print(f"{vocab_txt}: BERT format: {', '.join(notes)}", file=sys.stderr)
        return cls(tokens, lowercase=lowercase)

    def fingerprint(self):
        """sha1 of the vocabulary and the lowercase flag: caches keyed on it notice any change."""
        h = hashlib.sha1(f"lowercase={self.lowercase}\n".encode())
        h.update("\n".join(self.vocab).encode("utf-8"))
        return h.hexdigest()

    # -- training ---------------------------------------------------------------------------------
    @classmethod
    def train(cls, texts, vocab_size, lowercase=True, min_frequency=2, criterion="likelihood",
              progress=True, method="incremental"):
        """Learn a vocabulary of `vocab_size` tokens (specials included) from an iterable of
        strings. Words seen fewer than `min_frequency` times are left out (module docstring).
        method="naive" recounts everything before every merge (`_train_pieces_naive`, slow);
        "incremental" (`_train_pieces`) gives the same vocabulary, fast."""
        trainers = {"naive": _train_pieces_naive, "incremental": _train_pieces}
        if criterion not in ("likelihood", "ratio"):
            raise ValueError(f"criterion={criterion!r}; choose 'likelihood' or 'ratio'")
        if method not in trainers:
            raise ValueError(f"method={method!r}; choose 'incremental' or 'naive'")
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings, not one string")
        counts = collections.Counter()
        for text in texts:
            counts.update(basic_tokenize(text, lowercase))
        n_pieces = vocab_size - len(SPECIAL_TOKENS)
        pieces = trainers[method](counts, n_pieces, min_frequency, criterion, progress)
        return cls(list(SPECIAL_TOKENS) + pieces, lowercase=lowercase)


_UNUSED = regex.compile(r"\[unused\d+\]")


def _adopt_bert(tokens):
    """BERT's vocab.txt (a list of tokens) -> ours, every BERT id kept. Returns the new list and
    notes for the user, e.g. ["[SOS]=[CLS] (101)", ..., "[P] -> [unused0] (id 1)", ...].

    [CLS]/[SEP] serve as [SOS]/[EOS] as they are (the constructor finds them by either name).
    [P] and [ATTN], which BERT lacks, take the first [unusedN] slots, the place BERT left for new
    tokens, as BERT users do (the slot's line is renamed); a file without free slots gets them at
    the end, so a model's embedding table grows by two rows."""
    tokens = list(tokens)
    ids = {tok: i for i, tok in enumerate(tokens)}
    notes = [f"{ours}={bert} ({ids[bert]})" for ours, bert in BERT_NAMES.items()
             if bert in ids and ours not in ids]
    free = iter([i for i, tok in enumerate(tokens) if _UNUSED.fullmatch(tok)])
    for name in BERT_LACKS:
        if name in ids:
            continue
        i = next(free, None)
        if i is None:
            notes.append(f"{name} appended (id {len(tokens)})")
            tokens.append(name)
        else:
            notes.append(f"{name} -> {tokens[i]} (id {i})")
            tokens[i] = name
    return tokens, notes


_TIDY = [(regex.compile(r"(?<=\d) ([.,:]) (?=\d)"), r"\1"),
         (regex.compile(r" +([.,;:!?%)\]}])"), r"\1"),
         (regex.compile(r"([(\[{]) +"), r"\1"),
         (regex.compile(r"(?<=[\p{L}\p{N}]) ([-']) (?=[\p{L}\p{N}])"), r"\1"),
         # a contraction piece joins its word ("I 'm" -> "I'm", "do n't" -> "don't"): the reference
         # WordPiece decoder's cleanup for 's 'm 've 're n't, here also 'll 'd, and only for a
         # whole piece ("the 'some" stays)
         (regex.compile(r"(?<=[\p{L}\p{N}]) (?=(?:'(?:s|m|d|ll|re|ve)|n't)(?![\p{L}\p{N}]))"), "")]


def _tidy(text):
    for pattern, repl in _TIDY:
        text = pattern.sub(repl, text)
    return text


# -------------------------------------------------------------------------------------------------
# 3. Training: the WordPiece likelihood criterion, naive first, fast beside it

def _alphabet(counts, min_frequency):
    """Initial pieces: every character seen >= min_frequency times, plain, and "##c" if it was
    seen inside a word."""
    chars = collections.Counter()
    inner = set()
    for word, n in counts.items():
        for c in word:
            chars[c] += n
        inner.update(word[1:])
    keep = sorted(c for c, n in chars.items() if n >= min_frequency)
    return keep + [PREFIX + c for c in keep if c in inner]


def _start(counts, n_pieces, min_frequency):
    """What both trainers start from: the alphabet, and the kept (word, count) pairs, sorted so
    that training does not depend on the order of the texts."""
    alphabet = _alphabet(counts, min_frequency)
    words = sorted((w, n) for w, n in counts.items() if n >= min_frequency)
    if not words:
        raise utils.DataError(f"no word occurs at least min_frequency={min_frequency} times in the "
                              f"training texts ({len(counts)} distinct words seen): "
                              "nothing to train on")
    if n_pieces < len(alphabet):
        n_special = len(SPECIAL_TOKENS)
        raise utils.DataError(f"vocab_size={n_pieces + n_special} is too small: the alphabet alone "
                              f"needs {len(alphabet)} pieces + {n_special} special tokens = "
                              f"{len(alphabet) + n_special}")
    return alphabet, words


def _score(c, ca, cb, n0, criterion):
    """How good merging a pair is, from count(ab), count(a), count(b) and N (module docstring)."""
    if criterion == "ratio":
        return c / (ca * cb)
    return c * (math.log(c * n0 / (ca * cb)) - 1)        # first-order likelihood gain


def _train_pieces_naive(counts, n_pieces, min_frequency, criterion, progress=False):
    """Return `n_pieces` pieces: the alphabet, then merged pieces in merge order.

    The definition run as written: before every merge, count every symbol and every adjacent pair
    in every word from scratch. Obviously right, and one pass over all the words per merge: slow.
    `_train_pieces` makes the same merges, fast."""
    names, kept = _start(counts, n_pieces, min_frequency)
    # A symbol's rank is its age: the alphabet in order, then each merged piece as it is made
    rank = {s: i for i, s in enumerate(names)}
    # Each word as a list of symbols, "##" on all but the first: "the" -> ["t", "##h", "##e"]
    words = [([w[0]] + [PREFIX + c for c in w[1:]], n) for w, n in kept]
    # N, the number of symbols, held at its starting value (module docstring)
    n0 = sum(len(symbols) * n for symbols, n in words)
    bar = tqdm(total=n_pieces, initial=len(names), desc="wordpiece merges", disable=not progress)
    while len(names) < n_pieces:
        # Count every symbol and every adjacent pair, each word weighted by its frequency
        sym = collections.Counter()
        pair = collections.Counter()
        for symbols, n in words:
            for s in symbols:
                sym[s] += n
            for p in zip(symbols, symbols[1:]):
                pair[p] += n
        # Every word is a single symbol: nothing is left to merge
        if not pair:
            break

        # Best score first; ties go to the more frequent pair, then to the older symbols
        def key(p):
            score = _score(pair[p], sym[p[0]], sym[p[1]], n0, criterion)
            return (-score, -pair[p], rank[p[0]], rank[p[1]])
        a, b = min(pair, key=key)
        # The new piece: "t" + "##h" -> "th", "##h" + "##e" -> "##he"
        new = a + b[len(PREFIX):]
        # The same string can come from two splits ("th" + "##e", "t" + "##he"): it is one piece
        if new not in rank:
            rank[new] = len(names)
            names.append(new)
            bar.update(1)
        # Rewrite every word, left to right, non-overlapping: a b a b b -> ab ab b
        for symbols, _ in words:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == a and symbols[i + 1] == b:
                    symbols[i:i + 2] = [new]
                i += 1
    bar.close()
    return names


def _train_pieces(counts, n_pieces, min_frequency, criterion, progress=False):
    """Return the same pieces as `_train_pieces_naive`, in the same order, without the recounts.

    State: each kept word is a list of symbol ids with a frequency; `sym_count[s]` and
    `pair_count[(a, b)]` are frequency-weighted occurrence counts; `pair_words[(a, b)]` indexes the
    words that contain the pair, so a merge only revisits those words. The best pair comes from a
    max-heap of (-score, -count, a, b) with lazy validation: every time a pair's score may have
    changed -- its own count changed, or the count of one of its symbols did (then the pair is
    found through `pairs_of[symbol]`) -- a fresh entry is pushed, and a popped entry is used only
    if it still equals the pair's current key. Symbol ids are ranks as in the naive trainer, so
    ties are broken the same way, and training is deterministic.
    """
    alphabet, words = _start(counts, n_pieces, min_frequency)
    names = list(alphabet)
    sym_id = {s: i for i, s in enumerate(names)}
    seqs = [[sym_id[w[0]]] + [sym_id[PREFIX + c] for c in w[1:]] for w, _ in words]
    freqs = [n for _, n in words]

    sym_count = collections.Counter()
    pair_count = collections.Counter()
    pair_words = collections.defaultdict(set)
    pairs_of = collections.defaultdict(set)
    for wi, (seq, f) in enumerate(zip(seqs, freqs)):
        for s in seq:
            sym_count[s] += f
        for p in zip(seq, seq[1:]):
            pair_count[p] += f
            pair_words[p].add(wi)
    for a, b in pair_count:
        pairs_of[a].add((a, b))
        pairs_of[b].add((a, b))

    n0 = sum(sym_count.values())

    def key(p):          # the heap orders by this: best score first, then the more frequent pair
        c = pair_count[p]
        score = _score(c, sym_count[p[0]], sym_count[p[1]], n0, criterion)
        return (-score, -c, p[0], p[1])

    heap = [key(p) for p in pair_count]
    heapq.heapify(heap)
    bar = tqdm(total=n_pieces, initial=len(names), desc="wordpiece merges", disable=not progress)
    while len(names) < n_pieces and heap:
        entry = heapq.heappop(heap)
        p = (entry[2], entry[3])
        if pair_count[p] < 1 or key(p) != entry:
            continue     # stale: a fresher entry for this pair is in the heap (or it is gone)
        a, b = p
        new_name = names[a] + names[b][len(PREFIX):]
        if new_name not in sym_id:   # the same string can arise from two splits: reuse it
            sym_id[new_name] = len(names)
            names.append(new_name)
            bar.update(1)
        new = sym_id[new_name]
        changed = _merge(p, new, seqs, freqs, sym_count, pair_count, pair_words, pairs_of)
        for s in (a, b, new):        # their counts changed, so did the score of every pair on them
            live = {q for q in pairs_of[s] if pair_count[q] > 0}
            pairs_of[s] = live
            changed |= live
        for q in changed:
            if pair_count[q] > 0:
                heapq.heappush(heap, key(q))
    bar.close()
    return names


def _merge(pair, new, seqs, freqs, sym_count, pair_count, pair_words, pairs_of):
    """Replace every occurrence of `pair` by symbol `new` in the words that contain it, updating
    the counts. Returns the set of pairs whose count changed."""
    a, b = pair
    changed = set()
    for wi in sorted(pair_words.pop(pair)):
        seq = seqs[wi]
        f = freqs[wi]
        merged = []
        i = 0
        while i < len(seq):          # left to right, non-overlapping (as for ##s ##s ##s)
            if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                merged.append(new)
                i += 2
            else:
                merged.append(seq[i])
                i += 1
        k = len(seq) - len(merged)   # occurrences merged in this word
        sym_count[a] -= k * f
        sym_count[b] -= k * f
        sym_count[new] += k * f
        old_pairs = collections.Counter(zip(seq, seq[1:]))
        new_pairs = collections.Counter(zip(merged, merged[1:]))
        for q in old_pairs.keys() | new_pairs.keys():
            delta = new_pairs[q] - old_pairs[q]
            if delta:
                pair_count[q] += delta * f
                changed.add(q)
            if q not in new_pairs:
                pair_words[q].discard(wi)
            elif q not in old_pairs:
                pair_words[q].add(wi)
                pairs_of[q[0]].add(q)
                pairs_of[q[1]].add(q)
        seqs[wi] = merged
    pair_count[pair] = 0
    return changed

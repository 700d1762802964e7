"""A from-scratch WordPiece tokenizer: BERT's basic tokenizer, a likelihood trainer, vocab.txt.
docs/tokenizer.md gives the details, the decisions and the measured speeds.

1. `basic_tokenize(text, lowercase)`: BERT's BasicTokenizer (control characters dropped, spaces
   around CJK ideographs, lowercase + accents stripped, split on whitespace and punctuation).
2. WordPiece encoding (BERT's WordpieceTokenizer): greedy longest-match-first, "##" on continuing
   pieces; a word over 100 characters, or one the vocabulary cannot cover, becomes [UNK].
3. `WordPiece.train` (Schuster & Nakajima 2012): from characters, repeatedly merge the pair (a, b)
   whose piece "ab" most increases the unigram likelihood of the training words (`_score`); naive
   first (`_train_pieces_naive`), fast beside it (`_train_pieces`: the same merges).
Special tokens [PAD] [UNK] [SOS] [EOS] [MASK] [P] [ATTN] are ids 0..6 of a trained vocabulary;
`from_file` also reads BERT's vocab.txt. Left out: byte fallback, NFKC, offsets, batch encoding,
special-token parsing, truncation.
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
# BERT's names for [SOS]/[EOS]: either name finds the same id
BERT_NAMES = {"[SOS]": "[CLS]", "[EOS]": "[SEP]"}
BERT_LACKS = ("[P]", "[ATTN]")   # special tokens that `from_file` adds to BERT's vocab.txt
PREFIX = "##"                 # marks a piece that continues a word
MAX_WORD_CHARS = 100          # BERT's max_input_chars_per_word: longer words become [UNK]
CACHE_WORDS = 1 << 18         # size bound of the per-instance word cache

# --- 1. Basic tokenizer (BERT's BasicTokenizer) ---------------------------------------------------
# Category C* (Cc control, Cf format, Cs surrogate, Co private use, Cn unassigned) but not \t \n \r,
# plus U+FFFD. (\x00 is Cc.) V1 enables the set difference "--".
_CONTROL = regex.compile(r"[[\p{C}\uFFFD]--[\t\n\r]]", regex.V1)
# BERT's _is_chinese_char ranges: CJK Unified Ideographs, extensions A-E, compatibility ideographs
_CJK = regex.compile("([\u4E00-\u9FFF\u3400-\u4DBF\U00020000-\U0002A6DF\U0002A700-\U0002B73F"
                     "\U0002B740-\U0002B81F\U0002B820-\U0002CEAF\uF900-\uFAFF"
                     "\U0002F800-\U0002FA1F])")
_PUNCT = r"\p{P}!-/:-@\[-`{-~"                       # BERT's _is_punctuation
# A word is one punctuation character or a maximal run of anything but punctuation and whitespace
# (after _CONTROL, \s is what BERT's str.split() splits on)
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


# --- 2. The tokenizer -----------------------------------------------------------------------------
class WordPiece:
    """A WordPiece vocabulary with BERT's encoding; build it with `train` or `from_file`. `vocab`:
    the tokens, id = position, every special token included ([SOS]/[EOS] or BERT's [CLS]/[SEP])."""

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
        """Greedy longest-match-first split of one word into piece ids (BERT's Wordpiece)."""
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
        return [i for word in basic_tokenize(text, self.lowercase) for i in self._encode_word(word)]

    def tokenize(self, text):
        """Text -> list of piece strings, e.g. "Unaffable" -> ["un", "##aff", "##able"]."""
        return [self.vocab[i] for i in self.encode(text)]

    def decode(self, ids, skip_special=False):
        """Piece ids -> text: "##" pieces glued to the previous one, [PAD] dropped (every special
        with skip_special=True), spaces tidied (_TIDY; docs/tokenizer.md, "Decoding")."""
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
        text = " ".join(words)
        for pattern, repl in _TIDY:
            text = pattern.sub(repl, text)
        return text

    # -- files ------------------------------------------------------------------------------------
    def save(self, vocab_txt):
        """Write BERT's vocab.txt format (one token a line, id = line number), atomically."""
        utils.atomic_write(vocab_txt, "".join(tok + "\n" for tok in self.vocab))

    @classmethod
    def from_file(cls, vocab_txt, lowercase=True):
        """Load a vocab.txt: ours, or BERT's (adapted by `_adopt_bert`, said on stderr); a bad file
        is a utils.DataError naming the file and line."""
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
        """Learn `vocab_size` tokens (specials included) from an iterable of strings, words seen
        < `min_frequency` times left out; method "naive" or "incremental" (the same, fast)."""
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
    """BERT's vocab.txt tokens -> (ours, every BERT id kept; notes such as "[P] -> [unused0] (id
    1)"): [P] and [ATTN] take the first [unusedN] slots, or go at the end (docs/tokenizer.md)."""
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
         # a whole contraction piece joins its word ("do n't" -> "don't"; "the 'some" stays)
         (regex.compile(r"(?<=[\p{L}\p{N}]) (?=(?:'(?:s|m|d|ll|re|ve)|n't)(?![\p{L}\p{N}]))"), "")]


# --- 3. Training: the WordPiece likelihood criterion, naive first, fast beside it -----------------
def _alphabet(counts, min_frequency):
    """Initial pieces: every character seen >= min_frequency times, and "##c" if seen in a word."""
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
    """How good merging a pair is, from count(ab), count(a), count(b) and N, held at its start:
        gain(a, b) = count(ab) * (log(count(ab) * N / (count(a) * count(b))) - 1)
    ("ratio" is the popular shortcut docs/tokenizer.md compares)."""
    if criterion == "ratio":
        return c / (ca * cb)
    return c * (math.log(c * n0 / (ca * cb)) - 1)        # first-order likelihood gain


def _train_pieces_naive(counts, n_pieces, min_frequency, criterion, progress=False):
    """Return `n_pieces` pieces: the alphabet, then merged pieces in merge order. The definition
    run as written: before every merge, count every symbol and pair in every word from scratch."""
    names, kept = _start(counts, n_pieces, min_frequency)
    # A symbol's rank is its age: the alphabet in order, then each merged piece as it is made
    rank = {s: i for i, s in enumerate(names)}
    # Each word as a list of symbols, "##" on all but the first: "the" -> ["t", "##h", "##e"]
    words = [([w[0]] + [PREFIX + c for c in w[1:]], n) for w, n in kept]
    # N, the number of symbols, held at its starting value (_score)
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
    """Return the same pieces as `_train_pieces_naive`, in the same order, without the recounts:
    a merge revisits only the words holding its pair, and a lazily validated max-heap hands out
    the best pair (docs/tokenizer.md, "The fast trainer")."""
    names, words = _start(counts, n_pieces, min_frequency)
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

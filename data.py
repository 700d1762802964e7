"""Corpora and batches: documents -> sentences -> passages (pre-training) and (src, tgt) pairs
(seq2seq). docs/data.md shows the calls and describes the embedded corpus, caches and sharding.

A pre-training example is one passage of a document, a list of sentences of token ids; a seq2seq
example is (src_ids, tgt_ids); no special tokens are added here. The embedded default corpus is
the English prose CPython ships (pydoc topics, stdlib docstrings), its seq2seq task a docstring's
body -> its summary line (prepare_pretrain() and prepare_seq2seq(None, tok), cached in .cache/).
A pre-training corpus streams: read a line at a time, tokenized on every core into arrays of token
ids that training reads memory-mapped, so a corpus larger than memory trains in a bounded footprint.
Left out: seq2seq data larger than memory (read whole), a trained sentence splitter, any download.
"""
import array
import ast
import collections
import collections.abc
import functools
import hashlib
import inspect
import itertools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import sys
import sysconfig
import warnings
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from utils import DataError, UsageError, atomic_write, read_text, split_lines

_VERSION = 1  # bump when extraction, splitting or caching rules change: every cache is then rebuilt


class Document(NamedTuple):
    name: str  # stable id: split assignment hashes it
    text: str  # paragraphs separated by blank lines


def _sha1(*parts) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(str(p).encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def _code_key(cls) -> str:
    """Hash of the file defining the tokenizer class: editing tokenizer.py rebuilds the caches."""
    return hashlib.sha1(Path(inspect.getfile(cls)).read_bytes()).hexdigest()


def _bucket(name: str) -> float:
    """A stable number in [0, 1) for a name (crc32, unlike hash(), does not change between runs)."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) / 2**32


# ------------------------------------------------------------------------------ the embedded corpus
# test suites, the IDE, the turtle demos, installed third-party packages, generated codec tables
_SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "turtledemo", "site-packages",
              "dist-packages", "__pycache__", "encodings", "ensurepip"}
_MIN_DOC_CHARS = 200


def _docstrings(node, prefix=""):
    """(qualified name, cleaned docstring) of every class/function under node, in source order."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(child, clean=True)  # inspect.cleandoc: dedent, strip
            if doc:
                yield prefix + child.name, doc
            yield from _docstrings(child, prefix + child.name + ".")
        elif isinstance(child, ast.stmt):  # defs hide inside if/try/with blocks too
            yield from _docstrings(child, prefix)


def _parse_stdlib(root: Path) -> dict:
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    modules = []
    failed = 0
    for path in sorted(files):
        try:
            tree = ast.parse(path.read_bytes())  # bytes: ast honours the file's coding declaration
        except (SyntaxError, ValueError, UnicodeDecodeError, OSError):
            failed += 1
            continue
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        module_doc = ast.get_docstring(tree, clean=True) or ""
        defs = [["<module>", module_doc], *map(list, _docstrings(tree))]
        modules.append({"module": name, "docstrings": [d for d in defs if d[1]]})
    return {"files": len(files), "failed": failed, "modules": modules}


def stdlib_docstrings(cache_dir=".cache") -> dict:
    """{"files", "failed", "modules": [{"module", "docstrings": [[qualname, doc], ...]}]}, cached by
    Python version and stdlib path (cache_dir None: no cache)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    key = _sha1(sys.version, root, _VERSION)[:12]
    path = Path(cache_dir) / f"stdlib-docstrings-{key}.json" if cache_dir else None
    if path and path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    result = _parse_stdlib(root)
    if path:
        atomic_write(path, lambda f: f.write(json.dumps(result).encode("utf-8")))
    return result


def default_documents(cache_dir=".cache") -> list[Document]:
    """The embedded corpus: one document per pydoc topic, then one per stdlib module (its docstring,
    then its classes' and functions' docstrings in source order, each its own paragraph(s))."""
    from pydoc_data.topics import topics
    docs = [Document(f"topic:{k}", topics[k].strip()) for k in sorted(topics)]
    for m in stdlib_docstrings(cache_dir)["modules"]:
        name = f"stdlib:{m['module']}"
        docs.append(Document(name, "\n\n".join(doc for _, doc in m["docstrings"])))
    return [d for d in docs if len(d.text) >= _MIN_DOC_CHARS]


def _summary_pair(doc: str, max_src_words=256):
    """'Summary line(s).\\n\\nBody...' -> (body, summary), or None for another shape."""
    parts = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
    if len(parts) < 2:
        return None
    summary = " ".join(parts[0].split())
    body = parts[1].split()
    looks_like_signature = "->" in summary or re.match(r"[\w.]+\(", summary)  # "S.find(sub) -> int"
    if not 3 <= len(summary.split()) <= 40 or summary.endswith(":") or looks_like_signature:
        return None
    return None if len(body) < 8 else (" ".join(body[:max_src_words]), summary)


def default_seq2seq(cache_dir=".cache") -> dict[str, list[tuple[str, str]]]:
    """The embedded seq2seq task: stdlib docstring body (src) -> its summary line (tgt).
    Split by a stable hash of the MODULE name (~90/5/5), so a module's pairs stay in one split."""
    splits = {"train": [], "valid": [], "test": []}
    seen = set()
    for m in stdlib_docstrings(cache_dir)["modules"]:
        b = zlib.crc32(m["module"].encode()) % 100
        split = "train" if b < 90 else "valid" if b < 95 else "test"
        for _, doc in m["docstrings"]:
            pair = _summary_pair(doc)
            if pair and pair not in seen:  # _pyio and io, say, share docstrings
                seen.add(pair)
                splits[split].append(pair)
    return splits


# --------------------------------------------------------------------------- sentences and passages
_PARAGRAPH = re.compile(r"\n\s*\n")
# end punctuation (+ closing quotes/brackets), whitespace, then something that can start a sentence
_BOUNDARY = re.compile(r"""[.!?]+["')\]]*\s+(?=[A-Z0-9"'(\[])""")
_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf", "mr", "mrs", "ms", "dr", "prof", "st", "jr",
                  "sr", "fig", "al", "approx", "resp", "viz", "ca", "eq", "sec", "ch", "vol", "pp"}
_INITIALS = re.compile(r"(?:[a-z]\.)+[a-z]")  # "u.s", "a.b.c"


def split_sentences(text: str) -> list[str]:
    """Split text into sentences (whitespace collapsed): at blank lines, and after . ! ? before
    a capital, digit, quote or bracket, but not after an abbreviation, a single letter or initials
    (docs/data.md, "Sentences", lists the rules and their limits)."""
    sentences = []
    for para in _PARAGRAPH.split(text):
        para = " ".join(para.split())
        start = 0
        for m in _BOUNDARY.finditer(para):
            word = para[para.rfind(" ", 0, m.start()) + 1:m.start()].lstrip("\"'([").lower()
            if para[m.start()] == "." and (word in _ABBREVIATIONS or len(word) == 1
                                           or _INITIALS.fullmatch(word)):
                continue
            sentences.append(para[start:m.end()].rstrip())
            start = m.end()
        if para[start:]:
            sentences.append(para[start:])
    return sentences


def make_passages(sentences: list[list[int]], max_tokens: int) -> list[list[list[int]]]:
    """Pack one document's tokenized sentences, in order, into passages of whole consecutive
    sentences of at most max_tokens tokens each (a longer sentence is cut into pieces first)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    passages = []
    current = []
    used = 0
    for sent in sentences:
        for i in range(0, len(sent), max_tokens):
            piece = sent[i:i + max_tokens]
            # greedy: close the passage before it overflows
            if used + len(piece) > max_tokens:
                passages.append(current)
                current = []
                used = 0
            current.append(piece)
            used += len(piece)
    if current:
        passages.append(current)
    return passages


# ------------------------------------------------------------------------------- reading user files
def _read_text(path) -> str:
    """A file's text (utils.read_text: missing path, bytes not UTF-8), refusing an empty file."""
    text = read_text(path)
    if not text.strip():
        raise DataError(f"{path}: file is empty")
    return text.replace("\r\n", "\n")


def _text_files(path) -> list[tuple[Path, str]]:
    """(file, its name relative to path) of a .txt file, or of every *.txt below a folder."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.txt"))
        if not files:
            raise DataError(f"{path}: folder holds no *.txt files")
        return [(f, f.relative_to(path).as_posix()) for f in files]
    if path.exists():
        return [(path, path.name)]
    raise DataError(f"{path}: no such file or directory")


def _file_lines(path):
    """A UTF-8 file's lines, read one at a time (split_lines' rule, a BOM dropped), with
    utils.read_text's errors: a binary file, bytes that are not UTF-8 (byte offset and line)."""
    with open(path, "rb") as f:
        head = f.read(65536)
        # UTF-16 and most binary formats are full of NUL bytes; UTF-8 text has none or a stray few
        if head.count(0) > 0.3 * len(head):
            raise DataError(f"{path}: looks like a binary (or UTF-16) file, not UTF-8 text")
        f.seek(0)
        offset = 0
        # bytes split at b"\n": a UTF-8 character never contains that byte
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not UTF-8 at byte offset {offset + e.start} (line {n}): "
                                f"{e.reason}") from None
            offset += len(raw)
            if n == 1:
                line = line.removeprefix("\ufeff")
            yield line.removesuffix("\n").removesuffix("\r")


def _file_documents(path, name, one_per_line=False):
    """The documents ("name#index") of one file, streamed: a blank line ends a document, or with
    one_per_line every non-empty line is one."""
    index = 0
    lines = []
    # a blank line after the last one closes the last document
    for line in itertools.chain(_file_lines(path), [""]):
        if line.strip() and not one_per_line:
            lines.append(line)
            continue
        text = (line if one_per_line else "\n".join(lines)).strip()
        lines = []
        if text:
            yield Document(f"{name}#{index}", text)
            index += 1
    if index == 0:
        raise DataError(f"{path}: file is empty")


def iter_documents(path, one_per_line=False):
    """Documents ("file#index") of a .txt file or a folder (every *.txt below it, sorted), read a
    line at a time: a blank line separates documents; with one_per_line=True every non-empty line is
    one. A corpus larger than memory streams through it."""
    for f, name in _text_files(path):
        yield from _file_documents(f, name, one_per_line)


def read_documents(path, one_per_line=False) -> list[Document]:
    """iter_documents' documents as a list."""
    return list(iter_documents(path, one_per_line))


# A parallel pair is two files named by one of these patterns around a common part X.
_PARALLEL = [("{}.src", "{}.tgt"), ("{}.article.txt", "{}.title.txt"), ("src-{}.txt", "tgt-{}.txt")]


def _resolve_seq2seq(path) -> tuple[Path, Path | None]:
    """(source file, target file) for a .jsonl file (target None), either file of a parallel pair,
    or the common prefix of a pair ("data/train" for data/train.src + data/train.tgt)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".jsonl":
        return path, None
    for src_fmt, tgt_fmt in _PARALLEL:
        for fmt in (src_fmt, tgt_fmt):
            m = re.fullmatch(re.escape(fmt).replace(r"\{\}", "(.+)"), path.name)
            if m and path.is_file():
                return path.with_name(src_fmt.format(m[1])), path.with_name(tgt_fmt.format(m[1]))
        if path.with_name(src_fmt.format(path.name)).is_file():  # the prefix X of a pair
            return (path.with_name(src_fmt.format(path.name)),
                    path.with_name(tgt_fmt.format(path.name)))
    if not path.exists():
        raise DataError(f"{path}: no such file (nor a pair {path}.src/.tgt or "
                        f"{path}.article.txt/.title.txt)")
    raise DataError(f"{path}: expected a .jsonl file or a parallel pair named " +
                    ", ".join(f"{s.format('X')} + {t.format('X')}" for s, t in _PARALLEL))


def _read_jsonl(path: Path):
    for n, line in enumerate(split_lines(_read_text(path)), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if (not isinstance(obj, dict) or not isinstance(obj.get("src"), str)
                or not isinstance(obj.get("tgt"), str)):
            raise DataError(f'{path}:{n}: expected an object with string fields "src" and "tgt"')
        yield n, obj["src"], obj["tgt"]


def read_seq2seq(path) -> list[tuple[str, str]]:
    """(src, tgt) pairs from jsonl ({"src": ..., "tgt": ...} a line) or from parallel line files
    (_PARALLEL); empty targets are skipped with a warning, any other problem is a DataError."""
    src_path, tgt_path = _resolve_seq2seq(path)
    if tgt_path is None:
        rows = list(_read_jsonl(src_path))
    else:
        src = split_lines(_read_text(src_path))
        tgt = split_lines(_read_text(tgt_path))
        if len(src) != len(tgt):
            raise DataError(f"{src_path}: {len(src)} lines but {tgt_path}: {len(tgt)} lines")
        rows = [(n, s, t) for n, (s, t) in enumerate(zip(src, tgt), 1)]
    pairs = [(s.strip(), t.strip()) for _, s, t in rows if t.strip()]
    skipped = [n for n, _, t in rows if not t.strip()]
    if skipped:
        warnings.warn(f"{tgt_path or src_path}: skipped {len(skipped)} pairs with an empty target "
                      f"(first at line {skipped[0]})")
    if not pairs:
        raise DataError(f"{src_path}: no (src, tgt) pairs with a non-empty target")
    return pairs


# ----------------------------------------------------------------------------- tokenize once, cache
def _save_arrays(folder: Path, arrays: dict, meta: dict):
    for name, arr in arrays.items():
        atomic_write(folder / f"{name}.npy", lambda f: np.save(f, arr))
    # last: marks complete
    atomic_write(folder / "meta.json", lambda f: f.write(json.dumps(meta).encode()))


def _ragged(lists, dtype):
    """list of id lists -> (flat array, offsets): list i is flat[offsets[i]:offsets[i + 1]]."""
    offsets = np.cumsum([0] + [len(x) for x in lists], dtype=np.int64)
    return np.fromiter((t for x in lists for t in x), dtype=dtype, count=int(offsets[-1])), offsets


def _unragged(flat, offsets) -> list[list[int]]:
    flat = flat.tolist()
    offsets = offsets.tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _id_dtype(tokenizer):
    return np.uint16 if len(tokenizer) <= 2**16 else np.uint32


class _ArrayWriter:
    """A 1-d .npy file written in pieces, so that no array of the corpus's size is ever in memory:
    the pieces go to a temporary raw file; close() writes the header, then the raw bytes, atomically
    (the same bytes np.save writes)."""

    def __init__(self, path, dtype):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.raw = open(self.path.with_name(f"{self.path.name}.{os.getpid()}.raw.tmp"), "wb")

    def append(self, values):
        values = np.asarray(values, dtype=self.dtype)
        self.raw.write(values.tobytes())
        self.n += len(values)

    def close(self):
        self.raw.close()
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.n,)}

        def write(f):
            np.lib.format.write_array_header_1_0(f, header)
            with open(self.raw.name, "rb") as raw:
                shutil.copyfileobj(raw, f, 1 << 24)
        atomic_write(self.path, write)
        self.discard()

    def discard(self):
        """Remove the raw file (after close, or when the build fails half-way)."""
        self.raw.close()
        Path(self.raw.name).unlink(missing_ok=True)


class Corpus(NamedTuple):
    documents: object  # () -> a fresh pass over the documents, in order
    key: str           # the cache key: what the documents are made of, valid_frac, _VERSION
    label: str         # how messages name it
    size: int          # the progress bar's total: characters (a list of documents) or bytes (files)


def _corpus(data, valid_frac, one_per_line, cache_dir) -> Corpus:
    """data: None (the embedded corpus), a list of Documents (both keyed by their documents), or a
    path, read a line at a time at every pass and keyed by its files' names and bytes."""
    if data is None or not isinstance(data, (str, os.PathLike)):
        docs = default_documents(cache_dir) if data is None else list(data)
        key = _sha1(_VERSION, valid_frac, *(p for d in docs for p in d))
        label = "the embedded corpus" if data is None else "the given documents"
        return Corpus(lambda: iter(docs), key, label, sum(len(d.text) for d in docs))
    files = _text_files(data)
    digests = []
    for f, name in files:
        with open(f, "rb") as opened:
            digests += [name, hashlib.file_digest(opened, "sha1").hexdigest()]
    key = _sha1(_VERSION, valid_frac, one_per_line, *digests)
    return Corpus(lambda: iter_documents(data, one_per_line), key, str(data),
                  sum(f.stat().st_size for f, _ in files))


def _held_out(documents, valid_frac, label):
    """-> is_valid(name): the validation split, by a stable hash of each document's name, never
    empty (if no name falls below valid_frac, the one of the smallest hash). documents: one pass,
    read up to the first held-out document, so only a small corpus is read to its end."""
    if not 0 <= valid_frac < 1:
        raise ValueError(f"valid_frac must be in [0, 1), got {valid_frac}")
    if valid_frac == 0:
        return lambda name: False
    count = 0
    smallest = None
    for doc in documents:
        if _bucket(doc.name) < valid_frac:
            return lambda name: _bucket(name) < valid_frac
        count += 1
        if smallest is None or _bucket(doc.name) < _bucket(smallest):
            smallest = doc.name
    if count < 2:
        raise DataError(f"{label}: only {count} document(s), too few to hold out a "
                        "validation split (a blank line separates documents; for a file with "
                        "one document a line, add --one_document_per_line)")
    return lambda name: name == smallest


def _vocabulary(corpus, is_valid, vocab_size, cache_dir, progress):
    """Train a WordPiece on the training documents, or load the one trained on the same corpus."""
    from tokenizer import WordPiece
    key = _sha1(corpus.key, _code_key(WordPiece))[:12]
    path = Path(cache_dir) / f"vocab-{key}-{vocab_size}.txt"
    if path.exists():
        return WordPiece.from_file(path, lowercase=True), "hit"
    if progress:
        print(f"training a {vocab_size}-token WordPiece on the training split of {corpus.label}...")
    texts = (d.text for d in corpus.documents() if not is_valid(d.name))
    tok = WordPiece.train(texts, vocab_size, lowercase=True, min_frequency=2, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(path)  # atomic (temp file + os.replace)
    return tok, "trained"


# about 1 MB of documents a job for a tokenizing process: the hand-over costs little beside it
_JOB_CHARS = 1 << 20
# a tokenizing process's tokenizer and id dtype (_start_tokenizer)
_WORKER = {}


def _jobs(documents, is_valid):
    """(split, texts): the documents in order, in jobs of about _JOB_CHARS characters a split."""
    texts = {"train": [], "valid": []}
    chars = {"train": 0, "valid": 0}
    for doc in documents:
        split = "valid" if is_valid(doc.name) else "train"
        texts[split].append(doc.text)
        chars[split] += len(doc.text)
        if chars[split] >= _JOB_CHARS:
            yield split, texts[split]
            texts[split] = []
            chars[split] = 0
    for split in texts:
        if texts[split]:
            yield split, texts[split]


def _start_tokenizer(tokenizer, dtype):
    _WORKER.update(tokenizer=tokenizer, dtype=dtype)


def _tokenize_texts(texts):
    """One job: -> (the token ids, each sentence's length, each document's count of sentences)."""
    encode = _WORKER["tokenizer"].encode
    ids = []
    lengths = []
    counts = []
    for text in texts:
        # a sentence of only control characters tokenizes to nothing: dropped
        sentences = [s for s in map(encode, split_sentences(text)) if s]
        for s in sentences:
            ids += s
        lengths += map(len, sentences)
        counts.append(len(sentences))
    return np.array(ids, _WORKER["dtype"]), np.array(lengths, np.int64), np.array(counts, np.int64)


def _tokenized(jobs, tokenizer, dtype, processes):
    """(split, characters, _tokenize_texts' arrays) of every job, in order, from a pool of
    processes; two jobs a process are read ahead, no more (Pool.imap would queue the whole
    corpus)."""
    with multiprocessing.Pool(processes, _start_tokenizer, (tokenizer, dtype)) as pool:
        pending = collections.deque()
        for split, texts in jobs:
            chars = sum(map(len, texts))
            pending.append((split, chars, pool.apply_async(_tokenize_texts, (texts,))))
            if len(pending) > 2 * processes:
                split, chars, result = pending.popleft()
                yield split, chars, result.get()
        for split, chars, result in pending:
            yield split, chars, result.get()


def _tokenize_corpus(folder, corpus, is_valid, tokenizer, progress):
    """Every document's sentences, tokenized on every core, into each split's three arrays: tokens,
    sent_offsets (sentence i is tokens[s[i]:s[i + 1]]), doc_offsets (document d is sentences
    d[d]..d[d + 1] - 1). The text streams through: it is read once, and never held whole."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = _id_dtype(tokenizer)
    writers = {f"{split}.{name}": _ArrayWriter(folder / f"{split}.{name}.npy", t)
               for split in ("train", "valid")
               for name, t in (("tokens", dtype), ("sent_offsets", np.int64),
                               ("doc_offsets", np.int64))}
    bar = tqdm(total=corpus.size, desc="tokenizing", unit="B", unit_scale=True,
               disable=not progress)
    try:
        for split in ("train", "valid"):
            writers[f"{split}.sent_offsets"].append([0])
            writers[f"{split}.doc_offsets"].append([0])
        # every core this process may run on
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        for split, chars, (ids, lengths, counts) in _tokenized(
                _jobs(corpus.documents(), is_valid), tokenizer, dtype, cores):
            tokens, sentences, docs = (writers[f"{split}.{name}"]
                                       for name in ("tokens", "sent_offsets", "doc_offsets"))
            # the offsets go on from the split's counts so far (the offset arrays start with 0)
            docs.append(sentences.n - 1 + np.cumsum(counts))
            sentences.append(tokens.n + np.cumsum(lengths))
            tokens.append(ids)
            bar.update(chars)
        for w in writers.values():
            w.close()
    finally:
        bar.close()
        for w in writers.values():
            w.discard()


# ----------------------------------------------------------------------- passages, memory-mapped
def _pack(sent_offsets, doc_offsets, max_tokens, pieces, passages):
    """make_passages over every document, from the sentence offsets alone: appends to `pieces` where
    each piece (a sentence, or a max_tokens cut of a longer one) ends, to `passages` the number of
    each passage's first piece, then the count of pieces."""
    n_pieces = 0
    # documents by blocks: the offsets come off the disk a block at a time
    for d0 in range(0, len(doc_offsets) - 1, 4096):
        docs = doc_offsets[d0:d0 + 4097].tolist()
        # sentence i of the block (counted from its first): tokens bounds[i] .. bounds[i + 1]
        first = docs[0]
        bounds = sent_offsets[first:docs[-1] + 1].tolist()
        piece_ends = []
        firsts = []
        for a, b in zip(docs, docs[1:]):
            # a document's first piece opens a passage (used: as if the last one were full)
            used = max_tokens
            for i in range(a - first, b - first):
                end = bounds[i + 1]
                for cut in range(bounds[i], end, max_tokens):
                    size = min(max_tokens, end - cut)
                    # greedy: close the passage before it overflows
                    if used + size > max_tokens:
                        firsts.append(n_pieces)
                        used = 0
                    piece_ends.append(cut + size)
                    n_pieces += 1
                    used += size
        pieces.append(piece_ends)
        passages.append(firsts)
    passages.append([n_pieces])


def _passage_index(folder, split, max_tokens):
    """The split's packing into passages of max_tokens, made once from its sentence offsets and kept
    beside the tokens: a new budget packs anew, it never re-tokenizes."""
    paths = [folder / f"{split}.{name}-{max_tokens}.npy" for name in ("pieces", "passages")]
    if all(p.exists() for p in paths):
        return
    pieces, passages = (_ArrayWriter(p, np.int64) for p in paths)
    try:
        # the pieces tile the tokens: piece k is tokens[pieces[k]:pieces[k + 1]]
        pieces.append([0])
        _pack(np.load(folder / f"{split}.sent_offsets.npy", mmap_mode="r"),
              np.load(folder / f"{split}.doc_offsets.npy", mmap_mode="r"), max_tokens, pieces,
              passages)
        pieces.close()
        passages.close()
    finally:
        pieces.discard()
        passages.discard()


class Passages(collections.abc.Sequence):
    """A split's passages (make_passages'), read from the cache's memory-mapped arrays: passage i,
    a list of sentences of token ids, is made when asked for. Memory does not grow with the corpus,
    and DataLoader workers share the pages (the operating system's file cache)."""

    # the pages a map has touched count in the process's RSS (though the file cache holds them, and
    # gives them back under pressure): a fresh map every REMAP passages keeps that count small
    REMAP = 256

    def __init__(self, folder, split, max_tokens):
        self.where = (folder, split, max_tokens)
        _passage_index(Path(folder), split, max_tokens)
        self.map_files()

    def map_files(self):
        folder, split, max_tokens = self.where
        self.tokens = np.load(Path(folder) / f"{split}.tokens.npy", mmap_mode="r")
        # passage i is pieces first[i] .. first[i + 1] - 1
        self.pieces = np.load(Path(folder) / f"{split}.pieces-{max_tokens}.npy", mmap_mode="r")
        self.first = np.load(Path(folder) / f"{split}.passages-{max_tokens}.npy", mmap_mode="r")
        self.reads = 0

    def __len__(self):
        return len(self.first) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        # a negative index counts from the end; one past it is an IndexError
        i = range(len(self))[i]
        self.reads += 1
        if self.reads > self.REMAP:
            self.map_files()
        cuts = self.pieces[self.first[i]:self.first[i + 1] + 1].tolist()
        ids = self.tokens[cuts[0]:cuts[-1]].tolist()
        return [ids[a - cuts[0]:b - cuts[0]] for a, b in zip(cuts, cuts[1:])]

    def __reduce__(self):
        # a process it is sent to maps the files itself (a pickle would copy the arrays)
        return Passages, self.where

    def __repr__(self):
        return f"Passages({len(self):,} passages of {self.where[1]} in {self.where[0]})"


def prepare_pretrain(data=None, vocab_size=8192, cache_dir=".cache", max_tokens=253,
                     valid_frac=0.02, tokenizer=None, progress=True, one_per_line=False):
    """-> (tokenizer, {"train": Passages, "valid": Passages}, info). data: None (the embedded
    corpus), a path for iter_documents (streamed), or a list of Documents. Without a tokenizer a
    WordPiece is trained on the train split. The tokens are cached once and read memory-mapped
    (docs/data.md, "Passages and pre-training data")."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    corpus = _corpus(data, valid_frac, one_per_line, cache_dir)
    is_valid = _held_out(corpus.documents(), valid_frac, corpus.label)
    vocab_status = "given"
    if tokenizer is None:
        tokenizer, vocab_status = _vocabulary(corpus, is_valid, vocab_size, cache_dir, progress)
    tok_key = _sha1(tokenizer.fingerprint(), _code_key(type(tokenizer)))
    folder = Path(cache_dir) / f"pretrain-{_sha1(corpus.key, tok_key)[:16]}"
    hit = (folder / "meta.json").exists()
    if not hit:
        _tokenize_corpus(folder, corpus, is_valid, tokenizer, progress)
        # last: marks complete
        meta = {"corpus": corpus.label, "version": _VERSION}
        atomic_write(folder / "meta.json", json.dumps(meta))
    splits = {split: Passages(folder, split, max_tokens) for split in ("train", "valid")}
    info = {"cache": "hit" if hit else "rebuilt", "vocab": vocab_status, "cache_path": str(folder),
            "documents": {}, "sentences": {}, "tokens": {}, "passages": {}}
    for split, passages in splits.items():
        for key, name in (("documents", "doc_offsets"), ("sentences", "sent_offsets")):
            info[key][split] = len(np.load(folder / f"{split}.{name}.npy", mmap_mode="r")) - 1
        info["tokens"][split] = len(passages.tokens)
        info["passages"][split] = len(passages)
    return tokenizer, splits, info


def _sibling_splits(path) -> dict[str, Path]:
    """A file named with "train" brings siblings named "valid" (or "dev") and "test" instead."""
    src, _ = _resolve_seq2seq(path)
    found = {"train": Path(path)}
    if "train" in src.name:
        for split, words in (("valid", ("valid", "dev")), ("test", ("test",))):
            for w in words:
                sibling = src.with_name(w.join(src.name.rsplit("train", 1)))
                if sibling.is_file():
                    found[split] = sibling
                    break
    return found


def seq2seq_sources(path) -> dict[str, Path]:
    """{split: the file holding its sources} of a seq2seq path (a .jsonl, or the source file of a
    parallel pair) and its valid/test siblings: what generate.py --input reads."""
    return {split: _resolve_seq2seq(p)[0] for split, p in _sibling_splits(path).items()}


def prepare_seq2seq(data=None, tokenizer=None, cache_dir=".cache", progress=True):
    """-> {"train" | "valid" | "test": [(src_ids, tgt_ids), ...]}, tokenized once and cached;
    data=None: the embedded task, a path: read_seq2seq(path) and its siblings (_sibling_splits)."""
    if tokenizer is None:
        raise TypeError("prepare_seq2seq needs the tokenizer the model was pre-trained with")
    texts = (default_seq2seq(cache_dir) if data is None
             else {split: read_seq2seq(p) for split, p in _sibling_splits(data).items()})
    texts = {split: texts.get(split, []) for split in ("train", "valid", "test")}
    tok_key = _sha1(tokenizer.fingerprint(), _code_key(type(tokenizer)))
    key = _sha1(_VERSION, tok_key,
                *(x for split in texts for p in texts[split] for x in (split, *p)))
    folder = Path(cache_dir) / f"seq2seq-{key[:16]}"
    if not (folder / "meta.json").exists():
        arrays = {}
        dtype = _id_dtype(tokenizer)
        for split, pairs in texts.items():
            pairs = tqdm(pairs, desc=f"tokenizing {split}", disable=not progress or not pairs,
                         unit="pair")
            ids = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in pairs]
            # a target of only control characters tokenizes to nothing
            kept = [p for p in ids if p[1]]
            if len(kept) < len(ids):
                warnings.warn(f"{split}: skipped {len(ids) - len(kept)} pairs whose target has "
                              "no tokens")
            for side, i in (("src", 0), ("tgt", 1)):
                arrays[f"{split}.{side}"], arrays[f"{split}.{side}_offsets"] = _ragged(
                    [p[i] for p in kept], dtype)
        _save_arrays(folder, arrays, {"version": _VERSION})
    out = {}
    for split in texts:
        src, tgt = (_unragged(np.load(folder / f"{split}.{s}.npy"),
                              np.load(folder / f"{split}.{s}_offsets.npy"))
                    for s in ("src", "tgt"))
        out[split] = list(zip(src, tgt))
    return out


# -------------------------------------------------------------------- batches for one or many ranks
def batches(examples, batch_size, seed, epoch, rank=0, world_size=1, drop_last=True, start=0):
    """Yield lists of examples for one epoch, as this rank's share, from batch `start` on: every
    world_size-th of a shuffle fixed by (seed, epoch), the SAME number of batches on every rank
    (DDP would hang otherwise; docs/data.md, "Batches for one or many ranks")."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    mine = _rank_order(len(examples), seed, epoch, rank, world_size, drop_last)
    for b in range(start, num_batches(len(examples), batch_size, world_size, drop_last)):
        yield [examples[i] for i in mine[b * batch_size:(b + 1) * batch_size]]


# two epochs: a step may straddle their boundary
@functools.lru_cache(maxsize=2)
def _rank_order(n, seed, epoch, rank, world_size, drop_last):
    """This rank's example indices for one epoch: every world_size-th of the shared shuffle."""
    # 4 bytes an example below 2^31 examples, else 8 (a list of Python ints takes about 36): the one
    # array as long as the corpus; the shuffle moves items, whatever their type
    order = array.array("i" if n < 2 ** 31 else "q", range(n))
    random.Random(f"batches:{seed}:{epoch}").shuffle(order)
    per_rank = _per_rank(n, world_size, drop_last)
    # % n: wrap to pad
    mine = np.arange(rank, per_rank * world_size, world_size) % n
    return np.frombuffer(order, dtype=f"i{order.itemsize}")[mine]


def batch_at(examples, batch_size, seed, index, rank=0, world_size=1, drop_last=True):
    """Batch number `index` of this rank's endless stream, epoch after epoch of `batches`: random
    access, so a DataLoader worker builds any step's batch without replaying the others."""
    per_epoch = num_batches(len(examples), batch_size, world_size, drop_last)
    if per_epoch == 0:
        raise DataError(f"{len(examples)} examples are too few for batch_size {batch_size} "
                        f"on {world_size} rank(s)")
    epoch, b = divmod(index, per_epoch)
    mine = _rank_order(len(examples), seed, epoch, rank, world_size, drop_last)
    return [examples[i] for i in mine[b * batch_size:(b + 1) * batch_size]]


def _per_rank(n, world_size, drop_last):
    return n // world_size if drop_last else -(-n // world_size)  # -(-a // b): ceil division


def num_batches(n_examples, batch_size, world_size=1, drop_last=True) -> int:
    """How many batches batches() yields per epoch on each rank."""
    per_rank = _per_rank(n_examples, world_size, drop_last)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


# ---------------------------------------------------------------- train.py's stream of step batches
class StepBatches(torch.utils.data.IterableDataset):
    """Every training step's micro-batches on this process (grad_accum objectives.Batch), built on
    the CPU by the objective, as (step, batches, the objective's count of skipped examples).

    A step is grad_accum * world shards of batch_size examples: shard k of step s is batch
    s * shards + k of the endless stream (batch_at), with randomness of its own, and process `rank`
    builds shards rank, rank + world, ... as its micro-steps. A shard is the same whichever process
    builds it: a resumed run replays exactly, and so does one resumed on another number of processes
    with grad_accum * world unchanged (docs/data.md, "Shards")."""

    def __init__(self, objective, examples, batch_size, grad_accum, seed, max_steps, rank=0,
                 world=1, start=0, pack=None):
        self.objective = objective
        self.examples = examples
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.shards = grad_accum * world
        self.seed = seed
        self.max_steps = max_steps
        self.rank = rank
        self.world = world
        self.start = start
        # None: one passage a row; else the packing plan, Batch -> Batch (--pack: fast.plan_packing)
        self.pack = pack
        if num_batches(len(examples), batch_size) == 0:
            raise UsageError(f"{len(examples)} training examples are too few for --batch_size "
                             f"{batch_size}")

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        first, every = (worker.id, worker.num_workers) if worker else (0, 1)
        for step in range(self.start + first, self.max_steps, every):
            yield step, self.build(step), dict(self.objective.skipped)

    def shard(self, step, micro):
        """The run-wide number of this process's micro-step `micro` of step `step`: its batch in
        the endless stream (train.py seeds dropout with it too)."""
        return step * self.shards + micro * self.world + self.rank

    def position(self, step):
        """Where step `step` starts in the data: {"epoch", "index"} of its first shard (checkpoints
        record it)."""
        epoch, index = divmod(step * self.shards, num_batches(len(self.examples), self.batch_size))
        return {"epoch": epoch, "index": index}

    def build(self, step):
        self.objective.set_step(step, self.max_steps)           # PALM's two stages
        batches = []
        for micro in range(self.grad_accum):
            shard = self.shard(step, micro)
            examples = batch_at(self.examples, self.batch_size, self.seed, shard)
            # seeded by (seed, step, the shard's place in the step) alone, in the words of a single
            # process (rank 0, micro-step k): the same draws on any number of processes
            rng = random.Random(f"{self.seed}:0:{step}:{shard % self.shards}")
            batch = self.objective.make_batch(examples, rng)
            if self.pack is not None:
                # made here on the CPU, in the loader's workers: several passages a row
                batch = self.pack(batch)
            batches.append(batch)
        return batches


def leave_signals_to_the_trainer(worker_id):
    """A DataLoader worker ignores Ctrl-C and SIGTERM, sent to the whole process group: the
    trainer alone decides (it stops with a checkpoint, then ends its workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def batch_loader(dataset, workers=0, pin_memory=False):
    """A DataLoader over StepBatches: `workers` processes build the steps ahead (0: the caller
    builds each when asked); pinned memory for asynchronous copies to a GPU."""
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                       pin_memory=pin_memory, persistent_workers=workers > 0,
                                       prefetch_factor=4 if workers else None,
                                       worker_init_fn=leave_signals_to_the_trainer)


# ------------------------------------------------------------------------------------- command line
def export_seq2seq(out_dir, cache_dir=".cache"):
    """The embedded task as files: {split}.jsonl (train.py), test.src / test.tgt (generate.py)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = default_seq2seq(cache_dir)
    lines = {f"{split}.jsonl": [json.dumps({"src": s, "tgt": t}) for s, t in pairs]
             for split, pairs in task.items()}
    # test.src / test.tgt: one text a line (a newline inside a text would shift every later line)
    lines.update({f"test.{side}": [" ".join(p[i].split()) for p in task["test"]]
                  for side, i in (("src", 0), ("tgt", 1))})
    for name, rows in lines.items():
        atomic_write(out / name, lambda f: f.write("".join(r + "\n" for r in rows).encode("utf-8")))
    return {split: len(pairs) for split, pairs in task.items()}


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(
        description="Write the embedded docstring -> summary task as files.")
    ap.add_argument("command", choices=["export"])
    ap.add_argument("--out", default="docsum")
    ap.add_argument("--cache_dir", default=".cache")
    args = ap.parse_args()
    counts = export_seq2seq(args.out, args.cache_dir)
    print(f"wrote {args.out}/train.jsonl, valid.jsonl, test.jsonl ({counts}), test.src, test.tgt")

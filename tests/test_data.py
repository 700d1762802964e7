"""data.py: the embedded corpus, sentence splitting, passages, user files and their errors, caches (streamed,
memory-mapped: equal to the lists they replace), batches and the shards of a step.

The whole-stdlib extraction runs once (module fixture, in a temp folder); everything else uses small
synthetic corpora in tmp_path.
"""
import functools
import io
import itertools
import json
import pickle
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import data
from tokenizer import WordPiece


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="module")
def embedded(cache):
    return data.default_documents(cache)  # parses the stdlib once and writes the JSON cache


# ----------------------------------------------------------------------------- the embedded corpus

def test_embedded_corpus_is_real_and_deterministic(embedded, cache):
    # CPython 3.11: 462 documents, 2.12M characters; 3.12/3.13 drop distutils, lib2to3 and the dead
    # batteries (about 0.19M characters), hence the margin
    assert len(embedded) > 350
    assert sum(len(d.text) for d in embedded) > 1_500_000
    assert all(len(d.text) >= 200 for d in embedded)
    names = [d.name for d in embedded]
    assert len(set(names)) == len(names)
    assert any(n.startswith("topic:") for n in names) and "stdlib:difflib" in names
    assert not any(part in n.split(".") for n in names for part in ("test", "tests", "idlelib"))
    # the second call reads the JSON cache and gives exactly the same documents, in the same order
    assert data.default_documents(cache) == embedded
    assert len(list(cache.glob("stdlib-docstrings-*.json"))) == 1
    # real prose with sentences in it
    sentences = [s for d in embedded[:100] for s in data.split_sentences(d.text)]
    assert len(sentences) > 2000


def test_embedded_corpus_parses_without_importing(embedded, cache):
    info = data.stdlib_docstrings(cache)
    modules = {m["module"] for m in info["modules"]}
    assert info["files"] > 400 and info["failed"] == 0
    # antigravity would open a web browser if imported, tkinter.tix needs Tk: both parsed, neither imported
    assert {"antigravity", "tkinter.tix"} <= modules
    assert "antigravity" not in sys.modules and "tkinter.tix" not in sys.modules


def test_default_seq2seq_split_by_module(cache):
    task = data.default_seq2seq(cache)
    sizes = {k: len(v) for k, v in task.items()}
    assert sum(sizes.values()) > 2000 and sizes["valid"] > 50 and sizes["test"] > 50
    assert sizes["train"] > 0.8 * sum(sizes.values())
    assert data.default_seq2seq(cache) == task  # deterministic
    where = {pair: split for split, pairs in task.items() for pair in pairs}
    assert len(where) == sum(sizes.values())  # no pair in two splits
    owned = set()  # a pair repeated in a later module (distutils copies...) belongs to its first module
    for m in data.stdlib_docstrings(cache)["modules"]:  # every module's pairs sit in one split
        mine = {p for _, doc in m["docstrings"] if (p := data._summary_pair(doc)) in where} - owned
        assert len({where[p] for p in mine}) <= 1, m["module"]
        owned |= mine
    assert owned == set(where)
    src, tgt = task["train"][0]
    assert len(src.split()) >= 8 and 3 <= len(tgt.split()) <= 40 and "\n" not in src + tgt


def test_summary_pair_shape():
    doc = "Return the frobnicated value.\n\nThe value is frobnicated twice, then\nreturned to the caller as is."
    assert data._summary_pair(doc) == ("The value is frobnicated twice, then returned to the caller as is.",
                                       "Return the frobnicated value.")
    assert data._summary_pair("Only a summary line.") is None
    assert data._summary_pair("S.find(sub) -> int\n\nReturn the lowest index in S where sub is found.") is None


# ----------------------------------------------------------------------------- sentences and passages

@pytest.mark.parametrize("text, expected", [
    ("It works. It is fast! Is it? Yes.", ["It works.", "It is fast!", "Is it?", "Yes."]),
    ("Pi is 3.14 roughly. Next one.", ["Pi is 3.14 roughly.", "Next one."]),
    ("Use e.g. Python or i.e. Numbers, etc. Then stop.", ["Use e.g. Python or i.e. Numbers, etc. Then stop."]),
    ("Mr. Smith met J. R. Tolkien in the U.S. Later they left.",
     ["Mr. Smith met J. R. Tolkien in the U.S. Later they left."]),
    ('He said "Stop." Then he left (quickly.) After that, 2 more came.',
     ['He said "Stop."', "Then he left (quickly.)", "After that, 2 more came."]),
    ("Call os.path.join(a, b). Returns a str.", ["Call os.path.join(a, b).", "Returns a str."]),
    ("version 3.11.7 is here. lower case start stays. So.",
     ["version 3.11.7 is here. lower case start stays.", "So."]),
    ("First paragraph\nwraps here\n\n  \nSecond paragraph", ["First paragraph wraps here", "Second paragraph"]),
    ("", []),
])
def test_split_sentences(text, expected):
    assert data.split_sentences(text) == expected


def test_make_passages_budget_contiguity_no_empties():
    rng = random.Random(0)
    for _ in range(200):
        budget = rng.randint(1, 20)
        lengths = [rng.choice([0, 1, 3, 8, 25]) for _ in range(rng.randint(0, 12))]
        sentences = [[rng.randrange(100) for _ in range(n)] for n in lengths]
        passages = data.make_passages(sentences, budget)
        assert all(p and all(p) for p in passages)  # no empty passage, no empty sentence
        assert all(sum(map(len, p)) <= budget for p in passages)
        flat = lambda xs: [t for x in xs for t in x]
        assert flat(flat(passages)) == flat(sentences)  # nothing lost, nothing reordered
        kept = [x for p in passages for x in p]
        assert all(s in kept for s in sentences if 0 < len(s) <= budget)  # sentences that fit stay whole
        # packing is greedy: the next passage's first sentence would not have fitted
        for a, b in zip(passages, passages[1:]):
            assert sum(map(len, a)) + len(b[0]) > budget


def test_make_passages_cuts_long_sentence():
    passages = data.make_passages([[1, 2], list(range(10, 17)), [3]], max_tokens=3)
    assert passages == [[[1, 2]], [[10, 11, 12]], [[13, 14, 15]], [[16], [3]]]
    with pytest.raises(ValueError, match="max_tokens"):
        data.make_passages([[1]], 0)


# ----------------------------------------------------------------------------- user documents

def test_read_documents_folder(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.txt").write_text("Third doc.\n")
    (tmp_path / "a.txt").write_text("First doc\nwrapped.\n\n\nSecond doc.\n")
    (tmp_path / "ignored.md").write_text("not a txt file")
    docs = data.read_documents(tmp_path)
    assert [d.name for d in docs] == ["a.txt#0", "a.txt#1", "b/two.txt#0"]
    assert [d.text for d in docs] == ["First doc\nwrapped.", "Second doc.", "Third doc."]
    lines = data.read_documents(tmp_path / "a.txt", one_per_line=True)
    assert [d.text for d in lines] == ["First doc", "wrapped.", "Second doc."]


def test_read_documents_errors(tmp_path):
    with pytest.raises(data.DataError, match="nope.txt: no such file"):
        data.read_documents(tmp_path / "nope.txt")
    with pytest.raises(data.DataError, match="no \\*.txt files"):
        data.read_documents(tmp_path)
    (tmp_path / "empty.txt").write_text(" \n\n")
    with pytest.raises(data.DataError, match="empty.txt: file is empty"):
        data.read_documents(tmp_path)
    (tmp_path / "empty.txt").write_bytes("caf\u00e9 ok\n".encode() + b"bad \xff byte")
    with pytest.raises(data.DataError, match="empty.txt: not UTF-8 at byte offset 13 \\(line 2\\)"):
        data.read_documents(tmp_path)


# ----------------------------------------------------------------------------- user seq2seq files

def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("src_name, tgt_name, prefix", [
    ("train.src", "train.tgt", "train"), ("train.article.txt", "train.title.txt", "train"),
    ("src-dev.txt", "tgt-dev.txt", "dev")])
def test_read_parallel_files_any_of_the_pair(tmp_path, src_name, tgt_name, prefix):
    write_lines(tmp_path / src_name, ["a long source", "another\u2028source"])  # \u2028 must not split a line
    write_lines(tmp_path / tgt_name, ["short", "tgt"])
    expected = [("a long source", "short"), ("another\u2028source", "tgt")]
    for given in (src_name, tgt_name, prefix):
        assert data.read_seq2seq(tmp_path / given) == expected


def test_read_jsonl(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [json.dumps({"src": "s1", "tgt": "t1", "id": 3}), "",
                                              json.dumps({"src": " s2 ", "tgt": "t2"})])
    assert data.read_seq2seq(path) == [("s1", "t1"), ("s2", "t2")]


def test_read_seq2seq_errors(tmp_path):
    with pytest.raises(data.DataError, match="missing.jsonl: no such file"):
        data.read_seq2seq(tmp_path / "missing.jsonl")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(data.DataError, match="e.jsonl: file is empty"):
        data.read_seq2seq(tmp_path / "e.jsonl")
    (tmp_path / "u.jsonl").write_bytes(b'{"src": "ok", "tgt": "ok"}\n{"src": "\xc3(", "tgt": "x"}\n')
    with pytest.raises(data.DataError, match="u.jsonl: not UTF-8 at byte offset 36 \\(line 2\\)"):
        data.read_seq2seq(tmp_path / "u.jsonl")
    write_lines(tmp_path / "j.jsonl", ['{"src": "a", "tgt": "b"}', "", "{not json"])
    with pytest.raises(data.DataError, match="j.jsonl:3: not valid JSON"):
        data.read_seq2seq(tmp_path / "j.jsonl")
    write_lines(tmp_path / "k.jsonl", ['{"src": "a", "tgt": "b"}', '{"source": "a", "tgt": "b"}'])
    with pytest.raises(data.DataError, match='k.jsonl:2: expected an object with string fields "src" and "tgt"'):
        data.read_seq2seq(tmp_path / "k.jsonl")
    write_lines(tmp_path / "x.src", ["a", "b", "c"])
    write_lines(tmp_path / "x.tgt", ["a", "b"])
    with pytest.raises(data.DataError, match="x.src: 3 lines but .*x.tgt: 2 lines"):
        data.read_seq2seq(tmp_path / "x.src")
    (tmp_path / "lonely.txt").write_text("hello\n")
    with pytest.raises(data.DataError, match="expected a .jsonl file or a parallel pair"):
        data.read_seq2seq(tmp_path / "lonely.txt")


def test_empty_targets_are_counted_skips(tmp_path):
    write_lines(tmp_path / "y.src", ["a", "b", "c", "d"])
    write_lines(tmp_path / "y.tgt", ["A", "  ", "C", ""])
    with pytest.warns(UserWarning, match="y.tgt: skipped 2 pairs with an empty target \\(first at line 2\\)"):
        assert data.read_seq2seq(tmp_path / "y") == [("a", "A"), ("c", "C")]
    write_lines(tmp_path / "z.jsonl", [json.dumps({"src": "a", "tgt": ""})])
    with pytest.warns(UserWarning, match="skipped 1 pairs"):
        with pytest.raises(data.DataError, match="no \\(src, tgt\\) pairs"):
            data.read_seq2seq(tmp_path / "z.jsonl")


# ----------------------------------------------------------------------------- tokenize once, cache

WORDS = ("the cat dog sat on mat and ran far away from home garden river stone light dark "
         "green blue quick slow bird fish tree house window door table chair").split()


def synthetic_corpus(folder, n_docs=40, seed=0):
    """Files of documents (blank-line separated) of sentences drawn from a small word list."""
    rng = random.Random(seed)
    folder.mkdir(exist_ok=True)
    sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "."
    for f in range(2):
        docs = [" ".join(sentence() for _ in range(rng.randint(1, 8))) for _ in range(n_docs // 2)]
        (folder / f"part{f}.txt").write_text("\n\n".join(docs) + "\n")
    return folder


def test_prepare_pretrain_caches_and_rebuilds(tmp_path):
    corpus, cache = synthetic_corpus(tmp_path / "corpus"), tmp_path / "cache"
    tok, splits, info = data.prepare_pretrain(corpus, vocab_size=120, cache_dir=cache, max_tokens=20,
                                              valid_frac=0.1, progress=False)
    assert info["cache"] == "rebuilt" and info["vocab"] == "trained" and len(tok) == 120
    assert info["documents"]["train"] + info["documents"]["valid"] == 40 and info["documents"]["valid"] > 0
    assert info["passages"]["train"] == len(splits["train"]) > 0 and len(splits["valid"]) > 0
    assert all(0 < sum(map(len, p)) <= 20 and all(p) for p in splits["train"])
    assert np.load(next(cache.glob("pretrain-*/train.tokens.npy"))).dtype == np.uint16
    # the train tokens are the train documents' sentences, in order
    docs = data.read_documents(corpus)
    is_valid = data._held_out(docs, 0.1, "")
    expected = [t for d in docs if not is_valid(d.name) for s in data.split_sentences(d.text) for t in tok.encode(s)]
    assert [t for p in splits["train"] for s in p for t in s] == expected

    tok2, splits2, info2 = data.prepare_pretrain(corpus, vocab_size=120, cache_dir=cache, max_tokens=20,
                                                 valid_frac=0.1, progress=False)
    assert info2["cache"] == "hit" and info2["vocab"] == "hit"
    assert {k: list(v) for k, v in splits2.items()} == {k: list(v) for k, v in splits.items()}
    assert tok2.fingerprint() == tok.fingerprint()
    _, splits3, info3 = data.prepare_pretrain(corpus, vocab_size=120, cache_dir=cache, max_tokens=35,
                                              valid_frac=0.1, progress=False)
    assert info3["cache"] == "hit" and info3["tokens"] == info["tokens"]  # a new budget re-packs, no re-tokenizing
    assert len(splits3["train"]) < len(splits["train"])

    # a changed vocabulary rebuilds the token cache
    _, _, info4 = data.prepare_pretrain(corpus, vocab_size=100, cache_dir=cache, max_tokens=20,
                                        valid_frac=0.1, progress=False)
    assert info4["cache"] == "rebuilt" and info4["vocab"] == "trained"
    other = WordPiece.train(WORDS * 3, vocab_size=60)
    _, _, info5 = data.prepare_pretrain(corpus, cache_dir=cache, valid_frac=0.1, tokenizer=other, progress=False)
    assert info5["cache"] == "rebuilt" and info5["vocab"] == "given"

    # the same vocabulary with different encoding code (tokenizer.py edited) re-tokenizes
    class EditedWordPiece(WordPiece):  # defined in this file: its source differs from tokenizer.py
        pass
    same_vocab = EditedWordPiece(tok.vocab, lowercase=True)
    assert same_vocab.fingerprint() == tok.fingerprint()
    _, _, info_edit = data.prepare_pretrain(corpus, cache_dir=cache, valid_frac=0.1, tokenizer=same_vocab,
                                            progress=False)
    assert info_edit["cache"] == "rebuilt"

    # a changed source file rebuilds both vocabulary and tokens
    with open(corpus / "part1.txt", "a") as f:
        f.write("\nA brand new document about zebras.\n")
    _, _, info6 = data.prepare_pretrain(corpus, vocab_size=120, cache_dir=cache, max_tokens=20,
                                        valid_frac=0.1, progress=False)
    assert info6["cache"] == "rebuilt" and info6["vocab"] == "trained"
    assert info6["documents"]["train"] + info6["documents"]["valid"] == 41


def test_prepare_pretrain_valid_split(tmp_path):
    docs = [data.Document(f"d{i}", f"Document number {i} is here. It has two sentences.") for i in range(5)]
    tok = WordPiece.train([d.text for d in docs] * 2, vocab_size=80)
    _, _, info = data.prepare_pretrain(docs, cache_dir=tmp_path, valid_frac=0.01, tokenizer=tok, progress=False)
    assert info["documents"] == {"train": 4, "valid": 1}  # never an empty valid split
    assert data.prepare_pretrain(docs, cache_dir=tmp_path, valid_frac=0, tokenizer=tok,
                                 progress=False)[2]["documents"] == {"train": 5, "valid": 0}
    with pytest.raises(data.DataError, match="only 1 document"):
        data.prepare_pretrain(docs[:1], cache_dir=tmp_path, tokenizer=tok, progress=False)
    big = [data.Document(f"n{i}", "x y z. " * 3) for i in range(2000)]
    is_valid = data._held_out(big, 0.05, "")
    valid = [d.name for d in big if is_valid(d.name)]
    assert 50 < len(valid) < 150
    assert [d.name for d in big if data._held_out(big, 0.05, "")(d.name)] == valid
    # a large corpus is read only up to its first held-out document
    read = []
    data._held_out((read.append(d) or d for d in big), 0.05, "")
    assert len(read) == 1 + min(i for i, d in enumerate(big) if d.name in valid)


def test_prepare_seq2seq_siblings_and_cache(tmp_path):
    write_lines(tmp_path / "train.article.txt", ["the cat sat on the mat", "a dog ran far away", "birds sing"])
    write_lines(tmp_path / "train.title.txt", ["cat sat", "dog ran", "birds"])
    write_lines(tmp_path / "dev.article.txt", ["the bird sat"])
    write_lines(tmp_path / "dev.title.txt", ["bird"])
    tok = WordPiece.train(["the cat sat on the mat a dog ran far away bird birds sing"] * 3, vocab_size=60)
    out = data.prepare_seq2seq(tmp_path / "train", tok, cache_dir=tmp_path / "cache", progress=False)
    assert {k: len(v) for k, v in out.items()} == {"train": 3, "valid": 1, "test": 0}
    assert out["train"][0] == (tok.encode("the cat sat on the mat"), tok.encode("cat sat"))
    assert len(list((tmp_path / "cache").glob("seq2seq-*/meta.json"))) == 1
    assert data.prepare_seq2seq(tmp_path / "train.title.txt", tok, cache_dir=tmp_path / "cache") == out
    assert len(list((tmp_path / "cache").glob("seq2seq-*/meta.json"))) == 1  # second call: same cache
    single = data.prepare_seq2seq(tmp_path / "dev.article.txt", tok, cache_dir=tmp_path / "cache", progress=False)
    assert {k: len(v) for k, v in single.items()} == {"train": 1, "valid": 0, "test": 0}
    write_lines(tmp_path / "c.src", ["fine source", "control target"])
    write_lines(tmp_path / "c.tgt", ["fine", "\x00\x01"])  # survives strip(), but has no tokens
    with pytest.warns(UserWarning, match="train: skipped 1 pairs whose target has no tokens"):
        odd = data.prepare_seq2seq(tmp_path / "c.src", tok, cache_dir=tmp_path / "cache", progress=False)
    assert odd["train"] == [(tok.encode("fine source"), tok.encode("fine"))]
    with pytest.raises(TypeError, match="tokenizer"):
        data.prepare_seq2seq(tmp_path / "train")


# ----------------------------------------------------------------------------- batches

@pytest.mark.parametrize("n, batch_size, world_size, drop_last", [
    (103, 4, 1, True), (103, 4, 3, True), (103, 4, 3, False), (10, 3, 4, False), (64, 8, 8, True), (5, 2, 2, True)])
def test_batches_shard_disjoint_equal_counts(n, batch_size, world_size, drop_last):
    examples = list(range(n))
    per_rank = [list(data.batches(examples, batch_size, seed=1, epoch=2, rank=r, world_size=world_size,
                                  drop_last=drop_last)) for r in range(world_size)]
    n_batches = data.num_batches(n, batch_size, world_size, drop_last)
    assert {len(bs) for bs in per_rank} == {n_batches}  # the same count on every rank: DDP never hangs
    seen = [x for bs in per_rank for batch in bs for x in batch]
    if drop_last:
        assert all(len(batch) == batch_size for bs in per_rank for batch in bs)
        assert len(seen) == len(set(seen)) == n_batches * batch_size * world_size  # disjoint
        assert n - len(seen) < world_size * (batch_size + 1)  # only a tail is dropped
    else:
        assert set(seen) == set(examples)  # every example is seen; padding repeats fewer than world_size
        assert len(seen) - n < world_size
        assert len({len(bs[-1]) for bs in per_rank}) == 1


def test_batches_deterministic_and_shuffled_per_epoch():
    ex = list(range(50))
    a = list(data.batches(ex, 5, seed=0, epoch=0))
    assert a == list(data.batches(ex, 5, seed=0, epoch=0))
    assert a != list(data.batches(ex, 5, seed=0, epoch=1)) and a != list(data.batches(ex, 5, seed=1, epoch=0))
    assert sorted(x for b in a for x in b) == ex
    assert list(data.batches(ex, 5, seed=0, epoch=0, start=7)) == a[7:]
    # the order is the shuffle of the plain list (held in 4 bytes an example: the same moves)
    plain = list(range(50))
    random.Random("batches:0:0").shuffle(plain)
    assert [x for b in a for x in b] == plain
    assert data._rank_order(50, 0, 0, 0, 1, True).itemsize == 4


def test_batches_refuse_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank must be"):
        next(data.batches(list(range(23)), 4, seed=0, epoch=0, rank=2, world_size=2))


def test_batch_at_is_random_access_into_the_endless_stream():
    """data.batch_at(g) is the g-th batch of the epochs of data.batches laid end to end, on every
    rank (StepBatches resumes exactly through it)."""
    examples = list(range(103))
    for rank, world in ((0, 1), (1, 2), (2, 3)):
        stream = (batch for epoch in itertools.count()
                  for batch in data.batches(examples, 8, 3, epoch, rank, world))
        for g in range(40):
            batch = next(stream)
            assert batch == data.batch_at(examples, 8, 3, g, rank, world), (rank, world, g)
    with pytest.raises(data.DataError, match="too few"):
        data.batch_at(examples[:3], 8, 3, 0)


def test_step_batches_refuse_too_few_examples_before_any_worker_starts():
    """train.py's stream says it at once, in the trainer's process (a DataLoader worker's error
    would come back as a traceback), naming the flag to change."""
    with pytest.raises(data.UsageError, match=r"3 training examples are too few for --batch_size 8$"):
        data.StepBatches(None, list(range(3)), 8, 1, 0, 10, rank=0, world=2)


# ----------------------------------------------------------------------------- streamed, memory-mapped

def whole_file_documents(path, one_per_line=False):
    """The reference reader: the file read whole, then cut at blank lines (or lines)."""
    text = path.read_bytes().decode("utf-8").removeprefix("\ufeff").replace("\r\n", "\n")
    chunks = data.split_lines(text) if one_per_line else re.split(r"\n\s*\n", text)
    return [data.Document(f"{path.name}#{i}", c.strip()) for i, c in enumerate(c for c in chunks if c.strip())]


@pytest.mark.parametrize("one_per_line", [False, True])
def test_documents_stream_a_line_at_a_time_as_a_whole_file_would_split(tmp_path, one_per_line):
    path = tmp_path / "odd.txt"
    path.write_bytes("\ufeff\n \nFirst doc,\r\nline two.\r\n\r\n\t\n\u2028\nSecond\u2028doc.\n  \n\n  Third\n".encode()
                     + "caf\u00e9 last".encode())
    assert data.read_documents(path, one_per_line) == whole_file_documents(path, one_per_line)
    assert list(data.iter_documents(path, one_per_line)) == whole_file_documents(path, one_per_line)


def cache_as_lists(docs, is_valid, tok, max_tokens):
    """The reference: every split's sentences tokenized whole into lists, saved by np.save, and its
    passages packed by make_passages."""
    files, passages = {}, {}
    for split in ("train", "valid"):
        mine = [d for d in docs if is_valid(d.name) == (split == "valid")]
        per_doc = [[ids for ids in map(tok.encode, data.split_sentences(d.text)) if ids] for d in mine]
        sentences = [s for doc in per_doc for s in doc]
        arrays = {"tokens": np.array([t for s in sentences for t in s], np.uint16),
                  "sent_offsets": np.cumsum([0] + [len(s) for s in sentences], dtype=np.int64),
                  "doc_offsets": np.cumsum([0] + [len(doc) for doc in per_doc], dtype=np.int64)}
        for name, arr in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, arr)
            files[f"{split}.{name}.npy"] = buffer.getvalue()
        passages[split] = [p for doc in per_doc for p in data.make_passages(doc, max_tokens)]
    return files, passages


def test_the_memory_mapped_cache_equals_the_lists_it_replaces(tmp_path, monkeypatch):
    """Built streaming, a job of documents at a time on every core (64-character jobs: many in
    flight, handed back in order), the cache holds the bytes np.save writes for whole arrays, and
    the memory-mapped passages equal make_passages' lists, also in a DataLoader's workers."""
    corpus = synthetic_corpus(tmp_path / "corpus", n_docs=60)
    (corpus / "long.txt").write_text("A sentence far longer than the budget of passages " * 6 + ".\n")
    docs = data.read_documents(corpus)
    tok = WordPiece.train([d.text for d in docs], vocab_size=120)
    monkeypatch.setattr(data, "_JOB_CHARS", 64)
    _, splits, info = data.prepare_pretrain(corpus, cache_dir=tmp_path / "cache", max_tokens=20, valid_frac=0.1,
                                            tokenizer=tok, progress=False)
    files, passages = cache_as_lists(docs, data._held_out(docs, 0.1, ""), tok, 20)
    folder = Path(info["cache_path"])
    assert {name: (folder / name).read_bytes() for name in files} == files
    assert not list(folder.glob("*.tmp"))
    for split in ("train", "valid"):
        assert isinstance(splits[split], data.Passages) and len(splits[split]) == len(passages[split]) > 0
        assert list(splits[split]) == passages[split]
    train = splits["train"]
    assert train[-1] == passages["train"][-1] and train[2:5] == passages["train"][2:5]
    with pytest.raises(IndexError):
        train[len(train)]
    # a process it is sent to maps the files again: the pickle holds where they are, not the tokens
    assert len(pickle.dumps(train)) < 500 and list(pickle.loads(pickle.dumps(train))) == passages["train"]
    recorder = Recorder()
    in_process = list(data.batch_loader(data.StepBatches(recorder, train, 4, 2, 0, 6)))
    in_workers = list(data.batch_loader(data.StepBatches(recorder, train, 4, 2, 0, 6), workers=2))
    as_lists = list(data.batch_loader(data.StepBatches(recorder, passages["train"], 4, 2, 0, 6)))
    assert in_workers == in_process == as_lists


class Recorder:
    """An objective's stand-in: a 'batch' is the examples it is given and the first draw of its rng."""
    skipped = {}

    def set_step(self, step, total_steps):
        pass

    def make_batch(self, examples, rng):
        return examples, rng.random()


@functools.lru_cache(maxsize=None)
def rank_order_as_lists(n, seed, epoch, rank, world_size):
    order = list(range(n))
    random.Random(f"batches:{seed}:{epoch}").shuffle(order)
    per_rank = n // world_size
    return [order[i % n] for i in range(rank, per_rank * world_size, world_size)]


def test_one_process_draws_the_batches_the_list_stream_drew():
    """The reference: batch_at over a list order, and one process's step s built from batches
    s * grad_accum + m seeded "seed:0:s:m": the stream of StepBatches, the arrays' and the main job's."""
    examples = list(range(103))
    for rank, world in ((0, 1), (1, 2), (2, 3)):
        for g in range(0, 40, 3):
            per_epoch = 103 // world // 8
            mine = rank_order_as_lists(103, 3, g // per_epoch, rank, world)
            b = g % per_epoch
            assert data.batch_at(examples, 8, 3, g, rank, world) == [examples[i] for i in mine[b * 8:(b + 1) * 8]]
    stream = data.StepBatches(Recorder(), examples, 8, 3, 5, 100)
    for step in (0, 4, 9):
        expected = [(data.batch_at(examples, 8, 5, step * 3 + m), random.Random(f"5:0:{step}:{m}").random())
                    for m in range(3)]
        assert stream.build(step) == expected


def shards_of(examples, world, grad_accum, steps):
    """{shard number: its batch} of every process's micro-steps of `steps`."""
    built = {}
    for rank in range(world):
        stream = data.StepBatches(Recorder(), examples, 4, grad_accum, 7, 100, rank, world)
        for step in steps:
            for micro, batch in enumerate(stream.build(step)):
                built[stream.shard(step, micro)] = batch
    return built


def test_a_step_is_the_same_shards_on_any_number_of_processes():
    """grad_accum * world shards a step: 1 x 4, 2 x 2 and 4 x 1 build the same shards (examples and
    randomness), each once; steps 0-7 are the stream's batches 0-31, across epochs (12 an epoch)."""
    examples = list(range(50))
    one = shards_of(examples, 1, 4, range(8))
    assert sorted(one) == list(range(32))
    assert shards_of(examples, 2, 2, range(8)) == one == shards_of(examples, 4, 1, range(8))
    positions = [data.StepBatches(Recorder(), examples, 4, 4 // w, 7, 100, 0, w).position(5) for w in (1, 2, 4)]
    assert positions == [{"epoch": 1, "index": 8}] * 3

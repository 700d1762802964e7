"""Session fixtures shared by the objective, training and generation tests.

`tok`       a WordPiece vocabulary (2000 pieces) trained on a slice of the embedded corpus (CPython's docs)
`passages`  {"train", "valid"}: pre-training examples (lists of sentences of token ids, <= 96 tokens)
`pairs`     seq2seq examples (src_ids, tgt_ids) from the embedded docstring -> summary task
Built once per test session, in a temporary folder (tests never write into the repository).
"""
import random

import pytest
import torch

import data
from tokenizer import WordPiece

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine they thrash (10x slower seen here)
torch.set_num_threads(1)

N_DOCS = 300            # a slice of the corpus: enough for real statistics, small enough for 2 CPU cores


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def corpus_docs(cache_dir):
    docs = data.default_documents(cache_dir)
    return random.Random(0).sample(docs, min(N_DOCS, len(docs)))


@pytest.fixture(scope="session")
def tok(corpus_docs):
    return WordPiece.train([d.text for d in corpus_docs], vocab_size=2000)


@pytest.fixture(scope="session")
def passages(tok, corpus_docs):
    out = {"train": [], "valid": []}
    for k, doc in enumerate(corpus_docs):
        sentences = [tok.encode(s) for s in data.split_sentences(doc.text)]
        sentences = [s for s in sentences if s]
        out["valid" if k % 10 == 0 else "train"].extend(data.make_passages(sentences, 96))
    return out


@pytest.fixture(scope="session")
def pairs(tok, cache_dir):
    task = data.default_seq2seq(cache_dir)
    enc = lambda ex: (tok.encode(ex[0])[:64], tok.encode(ex[1])[:24])
    return {split: [enc(ex) for ex in task[split][:400]] for split in ("train", "valid")}

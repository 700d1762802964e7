"""Session fixtures shared by the objective, training and generation tests.

`tok`       a WordPiece vocabulary (2000 pieces) trained on a slice of the embedded corpus (CPython's docs)
`passages`  {"train", "valid"}: pre-training examples (lists of sentences of token ids, <= 96 tokens)
`pairs`     seq2seq examples (src_ids, tgt_ids) from the embedded docstring -> summary task
Built once per test session, in a temporary folder (tests never write into the repository).
The slowest tests are collected first (SLOWEST_FIRST): with `pytest -n 2` each worker starts on a long one and
the short ones fill the gaps, instead of one long test running alone at the end.
"""
import random

import pytest
import torch

import data
from tokenizer import WordPiece

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine they thrash (10x slower seen here)
torch.set_num_threads(1)

# (test file, test function) of the slowest tests, slowest first: seconds of each under `pytest -n 2 --durations`
# on a busy 2-core machine (2026-11-27); the order matters, not the numbers
SLOWEST_FIRST = [
    ("test_study.py", "test_tiny_study_two_workers_interrupted_resumed_imported_reported"),   # 220
    ("test_train.py", "test_sigkill_then_resume_gives_the_same_losses"),                       # 117, 96
    ("test_exercises.py", "test_grade_a_class"),                                                # 88
    ("test_exercises.py", "test_verify_checks_both_directions"),                                # 56
    ("test_loop.py", "test_pretrain_finetune_generate_evaluate"),                               # 23-45 each
    ("test_train.py", "test_torchrun_ddp_two_cpu_ranks_stay_identical"),                        # 32
    ("test_tokenizer.py", "test_incremental_trainer_equals_naive"),                             # 29, 30
    ("test_ernie_gen.py", "test_word_and_span_losses_fall"),                                    # 26
    ("test_train.py", "test_a_signal_to_the_whole_process_group_stops_cleanly_with_workers"),   # 22, 25
    ("test_train.py", "test_every_data_error_is_one_line"),                                     # 24
    ("test_train.py", "test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume"),                 # 19, 23
    ("test_generate.py", "test_cli_bad_flags_through_the_script"),                              # 21
    ("test_notebooks.py", "test_a_missing_checkpoint_is_announced_first_with_the_command_that_builds_it"),  # 21
]


def pytest_collection_modifyitems(items):
    # the same order in every xdist worker (it must be: each collects for itself); the rest keep theirs
    rank = {key: k for k, key in enumerate(SLOWEST_FIRST)}
    where = lambda item: (item.path.name, item.originalname)
    items.sort(key=lambda item: rank.get(where(item), len(rank)))


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

"""Benchmark tokenizer.py against HF `tokenizers` (the reference; a bench-only dependency). CPU only.

For two corpora -- (a) the embedded one, data.default_documents() (CPython's pydoc topics and stdlib
docstrings), and (b) every *.txt under a folder (default ../shared/data/corpus, read with
data.read_documents: a blank line separates documents) -- it holds out 5% of the documents, then
  1. trains an 8192-piece vocabulary with ours (WordPiece.train, min_frequency=2) and with the reference
     (BertWordPieceTokenizer.train_from_iterator: same vocab size, min_frequency, normalization, specials;
     note its trainer is BPE's frequency criterion with "##" prefixes, not WordPiece's likelihood),
  2. reports pieces per word on the held-out text (words = BERT basic-tokenizer words) for both, plus our
     trainer with criterion="ratio" for comparison, and the [UNK] rate,
  3. measures encoding throughput (MB of UTF-8 held-out text per second): ours one document at a time
     with a cold word cache (a fresh instance) and a warm one (second pass), the reference's `encode`
     one document at a time and `encode_batch` (Rust, multi-threaded),
  4. checks that the reference loaded with OUR vocab.txt yields our exact tokens on the held-out text.
Run:  python bench/bench_tokenizer.py [--corpus PATH] [--vocab-size 8192] [--repeats 3]
Timings are the best of --repeats runs (training: best of 2). Not run by CI.
"""
import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import data                                                     # noqa: E402
from tokenizer import SPECIAL_TOKENS, WordPiece, basic_tokenize  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def best_time(fn, repeats):
    """(best wall time in seconds, result of the last call)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def hold_out(texts, frac=0.05, seed=0):
    texts = sorted(texts)
    random.Random(seed).shuffle(texts)
    k = max(1, round(len(texts) * frac))
    return texts[k:], texts[:k]


def hf_tokenizer(vocab_file=None):
    from tokenizers import BertWordPieceTokenizer
    kw = dict(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True,
              unk_token="[UNK]", cls_token="[SOS]", sep_token="[EOS]", pad_token="[PAD]", mask_token="[MASK]")
    return BertWordPieceTokenizer(vocab_file, **kw)


def bench_corpus(name, texts, vocab_size, repeats):
    train, held = hold_out(texts)
    mb_train = sum(len(t.encode("utf-8")) for t in train) / 1e6
    mb_held = sum(len(t.encode("utf-8")) for t in held) / 1e6
    n_words = sum(len(basic_tokenize(t)) for t in held)
    print(f"\n## {name}: {len(train)} training documents ({mb_train:.2f} MB), {len(held)} held out "
          f"({mb_held:.3f} MB, {n_words} words)")

    t_ours, ours = best_time(lambda: WordPiece.train(train, vocab_size, progress=False), 2)
    t_ratio, ratio = best_time(lambda: WordPiece.train(train, vocab_size, criterion="ratio", progress=False), 1)

    def train_hf():
        tok = hf_tokenizer()
        tok.train_from_iterator(train, vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                special_tokens=list(SPECIAL_TOKENS))
        return tok
    t_hf, hf = best_time(train_hf, 2)
    print(f"train: ours {t_ours:.2f} s, ours(ratio) {t_ratio:.2f} s, reference {t_hf:.2f} s "
          f"(vocab {len(ours)} / {hf.get_vocab_size()})")

    enc_ours = [ours.encode(t) for t in held]
    enc_hf = hf.encode_batch(held, add_special_tokens=False)
    pieces = {"ours": sum(map(len, enc_ours)), "ours (criterion=ratio)": sum(len(ratio.encode(t)) for t in held),
              "reference": sum(len(e.ids) for e in enc_hf)}
    unk = {"ours": sum(e.count(ours.unk_id) for e in enc_ours),
           "reference": sum(e.tokens.count("[UNK]") for e in enc_hf)}
    ppw = {k: v / n_words for k, v in pieces.items()}
    print("pieces/word: " + ", ".join(f"{k} {v:.4f}" for k, v in ppw.items()) + f"; [UNK] pieces {unk}")

    # Encoding throughput on the held-out text, each with its own vocabulary.
    with tempfile.TemporaryDirectory() as tmp:
        vocab_txt = os.path.join(tmp, "vocab.txt")
        ours.save(vocab_txt)
        t_cold = float("inf")
        for _ in range(repeats):                  # a fresh instance each time: an empty word cache
            fresh = WordPiece.from_file(vocab_txt)
            t_cold = min(t_cold, best_time(lambda: [fresh.encode(t) for t in held], 1)[0])
        t_warm, _ = best_time(lambda: [fresh.encode(t) for t in held], repeats)
        t_single, _ = best_time(lambda: [hf.encode(t, add_special_tokens=False) for t in held], repeats)
        t_batch, _ = best_time(lambda: hf.encode_batch(held, add_special_tokens=False), repeats)
        # Parity on real text: the reference with OUR vocab must give our tokens.
        oracle = hf_tokenizer(vocab_txt)
        same = sum(oracle.encode(t, add_special_tokens=False).ids == e for t, e in zip(held, enc_ours))
    speed = {"ours, cold cache": mb_held / t_cold, "ours, warm cache": mb_held / t_warm,
             "reference encode": mb_held / t_single, "reference encode_batch": mb_held / t_batch}
    print("encode MB/s: " + ", ".join(f"{k} {v:.2f}" for k, v in speed.items()))
    print(f"parity: reference with our vocab.txt gives our ids on {same}/{len(held)} held-out documents")
    return dict(name=name, t_ours=t_ours, t_ratio=t_ratio, t_hf=t_hf, ppw=ppw, unk=unk, speed=speed,
                same=same, n_held=len(held), mb_train=mb_train)


def table(results):
    rows = ["| corpus | train ours (s) | train ref (s) | ours / ref | pieces/word ours | pieces/word ref "
            "| ours vs ref | pieces/word ours(ratio) | encode ours cold / warm (MB/s) "
            "| ref encode / encode_batch (MB/s) | ours cold / ref encode | parity |",
            "|" + " --- |" * 12]
    for r in results:
        p, s = r["ppw"], r["speed"]
        rows.append(
            f"| {r['name']} ({r['mb_train']:.1f} MB) | {r['t_ours']:.2f} | {r['t_hf']:.2f} "
            f"| {r['t_ours'] / r['t_hf']:.1f}x | {p['ours']:.4f} | {p['reference']:.4f} "
            f"| {100 * (p['ours'] / p['reference'] - 1):+.2f}% | {p['ours (criterion=ratio)']:.4f} "
            f"| {s['ours, cold cache']:.2f} / {s['ours, warm cache']:.2f} "
            f"| {s['reference encode']:.2f} / {s['reference encode_batch']:.2f} "
            f"| {s['ours, cold cache'] / s['reference encode']:.2f} | {r['same']}/{r['n_held']} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"))
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default=".cache", help="where data.py caches the parsed stdlib")
    args = ap.parse_args()
    results = [bench_corpus("embedded", [d.text for d in data.default_documents(args.cache_dir)],
                            args.vocab_size, args.repeats)]
    if Path(args.corpus).exists():
        results.append(bench_corpus(Path(args.corpus).name, [d.text for d in data.read_documents(args.corpus)],
                                    args.vocab_size, args.repeats))
    else:
        print(f"\n(skipping {args.corpus}: not found)")
    print(f"\nCPU: {os.cpu_count()} cores; vocab {args.vocab_size}; min_frequency 2; lowercase; 5% held out\n")
    print(table(results))


if __name__ == "__main__":
    main()

"""A synthetic pre-training corpus of any size, to measure data.py on a corpus larger than the embedded one: the
cache's build (time, MB/s), train.py's peak memory on it, the time from start to the first step.

    python bench/make_corpus.py /tmp/corpus --tokens 100000000     # ~390 MB of text in 8 files
    python train.py --objective pmlm --data /tmp/corpus/text --vocab /tmp/corpus/vocab.txt \\
        --cache_dir /tmp/corpus/cache --out_dir /tmp/corpus/run --device cpu --workers 2 --max_steps 300

Documents (a blank line between them) of 3 to 40 sentences drawn at random, with a fixed seed, from the embedded
corpus's sentences: real English prose, so the tokenizer works as hard as on real text. Enough is written for
`--tokens` tokens of the embedded corpus's vocabulary, which is written beside the text as vocab.txt (--vocab:
training a WordPiece on hundreds of MB is not what is measured). The corpus is never committed: delete it when done.
"""
import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data  # noqa: E402


def sentences_and_ratio(vocab_size, cache_dir):
    """The embedded corpus's sentences, its vocabulary, and tokens a character over those sentences."""
    tok, _, _ = data.prepare_pretrain(None, vocab_size, cache_dir, progress=False)
    sentences = [s for d in data.default_documents(cache_dir) for s in data.split_sentences(d.text)]
    tokens = sum(len(tok.encode(s)) for s in sentences)
    return sentences, tok, tokens / sum(len(s) + 1 for s in sentences)


def write_corpus(folder, sentences, chars, files, seed):
    """`files` text files of `chars` characters in all: documents of 3-40 random sentences."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        written = 0
        with open(folder / f"part-{f:03d}.txt", "w", encoding="utf-8") as out:
            while written < chars / files:
                doc = " ".join(rng.choices(sentences, k=rng.randint(3, 40))) + "\n\n"
                out.write(doc)
                written += len(doc)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write a synthetic pre-training corpus (OUT/text) and its "
                                             "vocabulary (OUT/vocab.txt).")
    ap.add_argument("out", help="a folder outside the repository, e.g. /tmp/corpus")
    ap.add_argument("--tokens", type=float, default=100e6, help="tokens to write (at least)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--vocab_size", type=int, default=4096, help="the main job's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache_dir", default=".cache")
    args = ap.parse_args()
    out = Path(args.out)
    sentences, tok, tokens_a_char = sentences_and_ratio(args.vocab_size, args.cache_dir)
    # 2% more than the ratio says: a sample's ratio varies a little
    chars = int(args.tokens / tokens_a_char * 1.02)
    write_corpus(out / "text", sentences, chars, args.files, args.seed)
    tok.save(out / "vocab.txt")
    size = sum(f.stat().st_size for f in (out / "text").iterdir())
    print(f"wrote {out / 'text'}: {args.files} files, {size / 1e6:,.0f} MB, about "
          f"{size * tokens_a_char / 1e6:,.0f}M tokens; its vocabulary: {out / 'vocab.txt'}")

"""Turn ../shared/data into what the GPU benchmarks read (never committed: .bench_data/ is git-ignored).

    python bench/prepare_bench_data.py [--shared ../shared/data] [--out .bench_data]

pretrain.txt  one document per Austen chapter, Wikipedia article and news story, documents separated by a blank
              line and paragraphs inside a document by single newlines (data.read_documents' format)
gigaword10k/  the Gigaword 10k files, copied as they are (train.* and valid.* pairs)
"""
import argparse
import re
import shutil
from pathlib import Path


def austen_chapters(path):
    text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
    for chapter in re.split(r"(?im)^\s*chapter\s+[ivxlc\d]+\.?\s*$", text)[1:]:
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", chapter)]
        yield "\n".join(p for p in paragraphs if p)


def wikipedia_articles(path):
    for article in re.split(r"\n(?== [^=].* =\n)", "\n" + path.read_text(encoding="utf-8")):
        lines = [ln.strip() for ln in article.splitlines()]
        paragraphs = [ln.replace("'''", "").replace("''", "") for ln in lines if ln and not ln.startswith("=")]
        if paragraphs:
            yield "\n".join(paragraphs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default="../shared/data")
    ap.add_argument("--out", default=".bench_data")
    args = ap.parse_args()
    shared, out = Path(args.shared), Path(args.out)
    out.mkdir(exist_ok=True)
    docs = [c for p in sorted((shared / "corpus/austen").glob("*.txt")) for c in austen_chapters(p)]
    docs += list(wikipedia_articles(shared / "corpus/wikipedia_sample.txt"))
    docs += [ln.strip() for ln in (shared / "corpus/lee_news.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    (out / "pretrain.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    shutil.copytree(shared / "gigaword10k", out / "gigaword10k", dirs_exist_ok=True)
    print(f"{len(docs)} documents, {sum(map(len, docs)) / 1e6:.1f}M characters -> {out / 'pretrain.txt'}")


if __name__ == "__main__":
    main()

"""A pilot of the study's ERNIE-GEN question: which fine-tuning factor makes its control the weakest?

    python bench/study/pilot_ernie_gen.py --data_dir ../shared/data --steps 600
    python bench/study/pilot_ernie_gen.py --only "ernie_gen rho_f 0.7,ernie_gen rho_f 0"

The study's controls differ ONLY in their fine-tuning recipe (no pre-training), and the issue saw
ERNIE-GEN's control lowest of the four on Gigaword (7.9 ROUGE-L). This pilot fine-tunes the tiny
preset from random weights on Gigaword 10k with each recipe (UniLM, UniLMv2, PALM, ERNIE-GEN at noise
rates rho_f 0.7 / 0.5 / 0), then reads the teacher-forced accuracy on held-out pairs (through the
decoding loop, bench/study.py) and the ROUGE-L of greedy decoding. A pilot, not the study: the GPU
study's cells answer the question at full size ("ernie_gen/ft noise 0", "ernie_gen/no pre-training,
ft noise 0", ...). Speed: on a loaded 2-core CPU, 100 steps of one recipe took 13 minutes; a GPU is
the place for it.
Left out: pre-training, beam search, seeds (one run each).
"""
import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import data  # noqa: E402
import evaluate  # noqa: E402
import generate  # noqa: E402
import train  # noqa: E402
from bench import study  # noqa: E402
from utils import read_lines  # noqa: E402

RECIPES = [("unilm", "unilm", {}), ("pmlm", "pmlm", {}), ("palm", "palm", {}),
           ("ernie_gen rho_f 0.7", "ernie_gen", {"rho_f": 0.7}),
           ("ernie_gen rho_f 0.5", "ernie_gen", {"rho_f": 0.5}),
           ("ernie_gen rho_f 0", "ernie_gen", {"rho_f": 0.0})]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default="out/pilot")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--n_valid", type=int, default=300)
    ap.add_argument("--only", default="", help="comma-separated recipe names")
    args = ap.parse_args()
    cache = str(Path(args.out) / "cache")
    tok, _, _ = data.prepare_pretrain(str(Path(args.data_dir) / "corpus"), 8192, cache,
                                      progress=False)
    vocab = Path(cache) / "pilot-vocab.txt"
    tok.save(vocab)
    prefix = Path(args.data_dir) / "gigaword10k" / "valid"
    sources = read_lines(f"{prefix}.article.txt")[:args.n_valid]
    refs = read_lines(f"{prefix}.title.txt")[:args.n_valid]
    rows = []
    for name, objective, options in RECIPES:
        if args.only and name not in args.only.split(","):
            continue
        out = Path(args.out) / name.replace(" ", "-")
        train_file = Path(args.data_dir) / "gigaword10k" / "train.article.txt"
        flags = ["--objective", objective, "--task", "seq2seq", "--preset", "tiny",
                 "--vocab", str(vocab), "--data", str(train_file), "--out_dir", str(out),
                 "--max_steps", str(args.steps), "--batch_size", "32", "--lr", "1e-3", "--seed", "0",
                 "--cache_dir", cache, "--progress", "false", "--overwrite", "true",
                 "--eval_interval", "1000000", "--eval_batches", "1", "--log_interval", "100"]
        for key, value in options.items():
            flags += [f"--{key}", str(value)]
        t0 = time.time()
        train.main(flags)
        model, tok2, obj = generate.load_checkpoint(str(out / "ckpt.pt"))
        hyps = generate.generate_text(model, tok2, obj, sources, beam_size=1, max_len=32,
                                      batch_size=64)
        accuracy = study.teacher_forced_accuracy(model, tok2, obj, sources, refs)
        rouge = 100 * evaluate.rouge(hyps, refs, stem=True)["rougeL"]["fmeasure"]
        rows.append(dict(recipe=name, teacher_forced_acc=accuracy, rougeL=rouge,
                         seconds=time.time() - t0, example=hyps[0]))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| recipe (from random weights) | teacher-forced acc | greedy ROUGE-L |\n|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['teacher_forced_acc']:.1f}% | {r['rougeL']:.2f} |")


if __name__ == "__main__":
    main()

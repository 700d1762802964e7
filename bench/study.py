"""The study no paper ran: the four objectives on one backbone, equal compute, seeds, two tasks, controls.

    python bench/study.py --out study/ --gpus 4                 # the study (needs ../shared/data and GPUs)
    python bench/study.py --out study/ --gpus 4                 # again: finished cells are never recomputed
    python bench/study.py --tiny --out /tmp/study               # the same code end to end on a CPU, in minutes

A CELL is one (system, seed): its pre-training (skipped for the controls), then for each task its fine-tuning,
decoding and scores, each written atomically under OUT/cells/ when done; a rerun reads what exists and computes the
rest, so the study survives a time limit, a crash or a machine handed back.
  systems    unilm, pmlm, ernie_gen, palm (each fine-tuned with its own recipe); a no-pre-training control per
             objective (its fine-tuning recipe from random weights); the papers' ablations that are cheap:
             ERNIE-GEN without the span flow (lam_pretrain 1) and without noise (rho_p 0), PALM without the copy
             head, UniLM without its seq2seq LM
  compute    every system pre-trains on the same number of CORPUS tokens (objective.corpus_tokens: the text it
             reads, not the [P] / [ATTN] rows it adds), with the same model, vocabulary and data; the table
             reports each one's wall time and training FLOPs (model.estimate_flops)
  tasks      Gigaword 10k (train on the 10k pairs, score ROUGE-1/2/L F1 on the 1,000 validation pairs) and SQuAD
             question generation (the dev part of the Du et al. split; the last 10% of its lines, whole
             paragraphs, held out for scoring; BLEU-4 13a and ROUGE-L). Both are lowercased and tokenized
             ("saints ?", "-lrb-"): ROUGE tokenizes on non-alphanumerics and BLEU with 13a, so our detokenized
             text and the references' tokenization score alike.
  decoding   beam 5, length penalty 0.6 (Gigaword) / 1.0 (SQuAD), trigram blocking, at most 32 tokens
The table (printed last, and OUT/study.json, OUT/study.png) gives per system and task the mean and standard
deviation over the seeds and the 95% bootstrap interval of the first seed's run.
--tiny: the tiny preset, the embedded corpus and the embedded docsum task for both task slots, two objectives and
a control, one seed, a few steps: what CI runs.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEMS = {
    "unilm": dict(objective="unilm"), "pmlm": dict(objective="pmlm"), "ernie_gen": dict(objective="ernie_gen"),
    "palm": dict(objective="palm"),
    "unilm/no pre-training": dict(objective="unilm", control=True),
    "pmlm/no pre-training": dict(objective="pmlm", control=True),
    "ernie_gen/no pre-training": dict(objective="ernie_gen", control=True),
    "palm/no pre-training": dict(objective="palm", control=True),
    "ernie_gen/no span flow": dict(objective="ernie_gen", pre=dict(lam_pretrain=1.0)),
    "ernie_gen/no noise": dict(objective="ernie_gen", pre=dict(rho_p=0.0)),
    "palm/no copy": dict(objective="palm", pre=dict(copy=False), ft=dict(copy=False)),
    "unilm/no seq2seq LM": dict(objective="unilm", pre=dict(weight_seq2seq=0.0)),
}
TINY_SYSTEMS = ("pmlm", "palm", "pmlm/no pre-training")
TASKS = {
    "gigaword": dict(train="gigaword10k/train.article.txt", score="gigaword10k/valid", lp=0.6,
                     metrics=("rouge1", "rouge2", "rougeL")),
    "squad_qg": dict(train="squad_qg/src-dev.txt", score=None, lp=1.0, metrics=("bleu", "rougeL")),
}


# --- the settings of a study --------------------------------------------------------------------------------------

def settings(args):
    """Model, budget and data of the study (or of its --tiny run)."""
    if args.tiny:
        return dict(preset="tiny", vocab=2048, corpus="", corpus_tokens=30_000, seq_len=96, batch=16,
                    ft_steps=20, ft_batch=16, lr=1e-3, ft_lr=1e-3, tasks={"docsum": None}, n_score=16,
                    systems=TINY_SYSTEMS)
    return dict(preset="small", vocab=16384, corpus=str(Path(args.data_dir) / "corpus"), corpus_tokens=40_000_000,
                seq_len=256, batch=64, ft_steps=1500, ft_batch=64, lr=5e-4, ft_lr=3e-4, tasks=TASKS, n_score=None,
                systems=tuple(SYSTEMS))


def squad_split(data_dir, out):
    """SQuAD QG's dev part as train/test files: the last 10% of the lines held out (consecutive lines are
    questions on one paragraph, so the held-out block is whole paragraphs but its first)."""
    folder = Path(out) / "squad_qg"
    if not (folder / "train.src").exists():
        from utils import atomic_write, read_lines
        src = read_lines(Path(data_dir) / "squad_qg" / "src-dev.txt")
        tgt = read_lines(Path(data_dir) / "squad_qg" / "tgt-dev.txt")
        cut = int(0.9 * len(src))
        while cut < len(src) and src[cut] == src[cut - 1]:      # do not split a paragraph's questions
            cut += 1
        for name, rows in (("train.src", src[:cut]), ("train.tgt", tgt[:cut]), ("test.src", src[cut:]),
                           ("test.tgt", tgt[cut:])):
            atomic_write(folder / name, "".join(r + "\n" for r in rows))
    return folder


# --- one cell ----------------------------------------------------------------------------------------------------

def train_flags(cfg, objective, out, cache, extra):
    flags = ["--objective", objective, "--preset", cfg["preset"], "--vocab_size", str(cfg["vocab"]),
             "--cache_dir", cache, "--out_dir", out, "--progress", "false", "--overwrite", "true",
             "--eval_interval", "1000000", "--eval_batches", "1", "--log_interval", "50"]
    for key, value in extra.items():
        flags += [f"--{key}", str(value).lower()]
    return flags


def pretrain_steps(cfg, objective, options, cache, seed):
    """-> (steps that read cfg["corpus_tokens"] corpus tokens with this objective, training FLOPs per step),
    both measured on real batches: the same reading for every objective, whatever each adds to it."""
    import data
    import model as M
    from objectives import get_objective
    tok, splits, _ = data.prepare_pretrain(cfg["corpus"] or None, cfg["vocab"], cache,
                                           max_tokens=cfg["seq_len"] - 3, progress=False)
    shape = M.PRESETS[cfg["preset"]]
    obj = get_objective(objective, tok, max_len=shape["max_position"], **options)
    obj.set_step(10 ** 9, 10 ** 9)
    model = M.Transformer(M.ModelConfig(**{**shape, **obj.model_defaults, "vocab_size": len(tok)}))
    rng = random.Random(seed)
    batches = [obj.make_batch(rng.sample(splits["train"], cfg["batch"]), rng) for _ in range(5)]
    corpus = statistics.mean(obj.corpus_tokens(b) for b in batches)
    flops = statistics.mean(b.n_tokens * model.estimate_flops(b.input_ids.size(1),
                                                              int((b.labels != -100).sum()) / b.n_tokens)
                            for b in batches)
    return max(1, round(cfg["corpus_tokens"] / corpus)), flops


def run_cell(system, seed, cfg, args):
    """Pre-train (unless a control), then fine-tune, decode and score on every task -> the cell's record."""
    import train
    spec = SYSTEMS[system]
    objective = spec["objective"]
    work = Path(args.out) / "work" / f"{system.replace('/', '_').replace(' ', '-')}-s{seed}"
    cache = str(Path(args.out) / "cache")
    record = dict(system=system, seed=seed, tasks={})
    start = None
    if not spec.get("control"):
        steps, flops_per_step = pretrain_steps(cfg, objective, spec.get("pre", {}), cache, seed)
        t0 = time.time()
        flags = train_flags(cfg, objective, str(work / "pre"), cache, spec.get("pre", {}))
        train.main(flags + ["--max_steps", str(steps), "--seq_len", str(cfg["seq_len"]), "--batch_size",
                            str(cfg["batch"]), "--lr", str(cfg["lr"]), "--seed", str(seed)]
                   + (["--data", cfg["corpus"]] if cfg["corpus"] else []))
        record["pretrain"] = dict(steps=steps, seconds=time.time() - t0, flops=steps * flops_per_step)
        start = str(work / "pre" / "ckpt.pt")
    for task in cfg["tasks"]:
        record["tasks"][task] = finetune_and_score(objective, spec, task, start, work, cache, cfg, seed, args)
    return record


def finetune_and_score(objective, spec, task, start, work, cache, cfg, seed, args):
    import train
    out = work / f"ft-{task}"
    if task == "docsum":
        data_flag = []
    elif task == "gigaword":
        data_flag = ["--data", str(Path(args.data_dir) / TASKS[task]["train"])]
    else:
        data_flag = ["--data", str(squad_split(args.data_dir, args.out) / "train.src")]
    flags = train_flags(cfg, objective, str(out), cache, spec.get("ft", {}))
    flags += ["--task", "seq2seq", "--max_steps", str(cfg["ft_steps"]), "--batch_size", str(cfg["ft_batch"]),
              "--lr", str(cfg["ft_lr"]), "--seed", str(seed)] + data_flag
    if start:
        flags += ["--init_from", start]
    else:
        flags += ["--vocab", vocab_file(cfg, cache)]
    t0 = time.time()
    train.main(flags)
    seconds = time.time() - t0
    sources, refs = score_split(task, args, cfg)
    return dict(seconds=seconds, **score(out / "ckpt.pt", task, sources, refs))


def vocab_file(cfg, cache):
    """The study's vocabulary as a file (a control starts from random weights but reads the same pieces)."""
    import data
    path = Path(cache) / f"study-vocab-{cfg['vocab']}.txt"
    if not path.exists():
        tok, _, _ = data.prepare_pretrain(cfg["corpus"] or None, cfg["vocab"], cache, progress=False)
        tok.save(path)
    return str(path)


def score_split(task, args, cfg):
    """(sources, references) of the held-out split a task is scored on."""
    from utils import read_lines
    if task == "docsum":
        import data
        pairs = data.default_seq2seq()["test"][:cfg["n_score"]]
        return [s for s, _ in pairs], [" ".join(t.split()) for _, t in pairs]
    if task == "gigaword":
        prefix = Path(args.data_dir) / TASKS[task]["score"]
        return read_lines(f"{prefix}.article.txt"), read_lines(f"{prefix}.title.txt")
    folder = squad_split(args.data_dir, args.out)
    return read_lines(folder / "test.src"), read_lines(folder / "test.tgt")


def score(ckpt, task, sources, refs):
    import torch
    import evaluate
    import generate
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok, obj = generate.load_checkpoint(str(ckpt), device)
    lp = TASKS.get(task, {}).get("lp", 1.0)
    with torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda"):
        hyps = generate.generate_text(model, tok, obj, sources, beam_size=5, length_penalty=lp, max_len=32,
                                      batch_size=64)
    rouge = evaluate.rouge_bootstrap(hyps, refs, stem=True, n_samples=1000)
    out = {k: dict(f=100 * rouge[k]["fmeasure"]["mean"], low=100 * rouge[k]["fmeasure"]["low"],
                   high=100 * rouge[k]["fmeasure"]["high"]) for k in ("rouge1", "rouge2", "rougeL")}
    out["bleu"] = dict(f=evaluate.bleu(hyps, refs), low=None, high=None)
    out["examples"] = hyps[:3]
    return out


# --- the study: cells in parallel, resumable -----------------------------------------------------------------------

def cell_path(args, system, seed):
    return Path(args.out) / "cells" / f"{system.replace('/', '_').replace(' ', '-')}-s{seed}.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="study")
    ap.add_argument("--gpus", type=int, default=0, help="cells in parallel, one GPU each (0: one at a time)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated systems")
    ap.add_argument("--cell", default="", help=argparse.SUPPRESS)       # internal: run one cell, write its JSON
    args = ap.parse_args()
    cfg = settings(args)
    if args.tiny:
        args.seeds = 1
    if args.cell:
        system, seed = args.cell.rsplit("@", 1)
        record = run_cell(system, int(seed), cfg, args)
        from utils import atomic_write
        atomic_write(cell_path(args, system, int(seed)), json.dumps(record, indent=1))
        return
    Path(args.out, "cells").mkdir(parents=True, exist_ok=True)
    systems = [s for s in cfg["systems"] if not args.only or s in args.only.split(",")]
    todo = [(s, k) for s in systems for k in range(args.seeds) if not cell_path(args, s, k).exists()]
    print(f"{len(systems) * args.seeds - len(todo)} cells done, {len(todo)} to run", flush=True)
    run_cells(todo, args)
    report(systems, cfg, args)


def run_cells(todo, args):
    slots = max(1, args.gpus)
    running = {}
    while todo or running:
        while todo and len(running) < slots:
            system, seed = todo.pop(0)
            slot = next(i for i in range(slots) if i not in running.values())
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if args.gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(slot)
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 4) // slots))
            log = open(Path(args.out) / f"{system.replace('/', '_').replace(' ', '-')}-s{seed}.log", "w")
            cmd = [sys.executable, __file__, "--cell", f"{system}@{seed}", "--out", args.out, "--data_dir",
                   args.data_dir] + (["--tiny"] if args.tiny else [])
            running[subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)] = slot
        time.sleep(0.5)
        for proc in [p for p in running if p.poll() is not None]:
            if proc.returncode:
                print(f"a cell failed (exit {proc.returncode}): {' '.join(proc.args[3:5])}; see its log in "
                      f"{args.out}", flush=True)
            del running[proc]


def report(systems, cfg, args):
    rows = []
    for system in systems:
        cells = [json.loads(cell_path(args, system, k).read_text()) for k in range(args.seeds)
                 if cell_path(args, system, k).exists()]
        for task in cfg["tasks"]:
            metrics = TASKS.get(task, {}).get("metrics", ("rouge1", "rouge2", "rougeL"))
            for m in metrics:
                values = [c["tasks"][task][m]["f"] for c in cells if task in c["tasks"]]
                if not values:
                    continue
                first = cells[0]["tasks"][task][m]
                rows.append(dict(system=system, task=task, metric=m, mean=statistics.mean(values),
                                 std=statistics.stdev(values) if len(values) > 1 else 0.0, seeds=len(values),
                                 ci=(first["low"], first["high"]),
                                 pretrain_s=statistics.mean(c.get("pretrain", {}).get("seconds", 0) for c in cells),
                                 pretrain_steps=cells[0].get("pretrain", {}).get("steps", 0),
                                 pretrain_flops=cells[0].get("pretrain", {}).get("flops", 0)))
    Path(args.out, "study.json").write_text(json.dumps(dict(settings={k: v for k, v in cfg.items() if k != "tasks"},
                                                            tasks=list(cfg["tasks"]), rows=rows), indent=1))
    plot(rows, args.out)
    print("\n| system | task | metric | mean | std | seeds | 95% CI (seed 0) | pre-training steps / s / FLOPs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ci = f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]" if r["ci"][0] is not None else "-"
        print(f"| {r['system']} | {r['task']} | {r['metric']} | {r['mean']:.2f} | {r['std']:.2f} | {r['seeds']} | "
              f"{ci} | {r['pretrain_steps']} / {r['pretrain_s']:.0f} / {r['pretrain_flops']:.2g} |")


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot; pip install -r requirements-notebooks.txt)")
        return
    main = [r for r in rows if r["metric"] in ("rougeL",)]
    if not main:
        return
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(main) + 1), dpi=80)
    labels = [f"{r['system']} ({r['task']})" for r in main]
    ax.barh(range(len(main)), [r["mean"] for r in main], xerr=[r["std"] for r in main], color="tab:blue")
    ax.set_yticks(range(len(main)), labels, fontsize=8)
    ax.set_xlabel("ROUGE-L F1 (mean over seeds, error bar: std)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(Path(out) / "study.png")


if __name__ == "__main__":
    main()

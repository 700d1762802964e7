"""The study: what each of four pre-training objectives adds, on one backbone at equal corpus tokens, with every
choice made on dev and every reported number scored once on test; resumable across machines.

    python bench/study.py --gpus 4 --per_gpu 4 --mps --time_limit_min 8 --data_dir out/data \\
        --cells_out $OUT/cells.jsonl            # the whole protocol; run it again until "0 to run": it resumes
    python bench/study.py import cells.jsonl    # merge new cells into bench/study/cells.jsonl
    python bench/study.py report                # bench/study/README.md, tables.md, samples.md, superseded/README.md
    python bench/study.py plan                  # the jobs left and their time, estimated from measured cells
    python bench/study.py --tiny --per_gpu 2 --out /tmp/study   # the same protocol at toy size on a CPU (CI)

The protocol. DEV is carved from each task's training pairs (SPLITS: Gigaword 10k's last 1,000 training pairs;
SQuAD QG's tenth of lines before its held-out tenth, cut between two source sentences). SELECTION: each objective
and each control (the same fine-tuning from random weights) is fine-tuned on the training pairs left with every
configuration of one GRID, the same size for all (2 peak lrs x 2 values of the objective's own corruption of the
target x 2 dropouts, seed 0), each decoded on dev at 4 length penalties; the highest dev score of the 32 is the
choice (choose(), which refuses a score of any other split). FINALS: every system fine-tuned on all training
pairs with its choice (an ablation or diagnostic with its parent's), 3 seeds, decoded once on the TEST split
(Gigaword's 1,000 validation pairs; SQuAD QG's last tenth), which no choice reads. INTERVALS: a paired bootstrap
over test pairs and seeds together (interval()), on the scores and on each objective's gain over its control.
  systems    SYSTEMS: the four objectives, their controls, the papers' cheap ablations, diagnostics of ERNIE-GEN's
             and PALM's results
  compute    every system pre-trains the same model (small preset, 16,384-piece vocabulary, text 256, batch 128,
             peak lr 7e-4) on the same 40M CORPUS tokens (objective.corpus_tokens: the text it reads, not the
             [P] / [ATTN] rows it adds); fine-tuning is 1,500 steps of 64 pairs; cells record wall times and FLOPs
  decoding   beam 5, trigram blocking, <= 32 tokens, the chosen length penalty
A CELL is one fine-tuning as one JSON line: its split ("dev" or "test"), options, pre-training record, wall times,
FLOPs, scores (dev: at each length penalty; test: with each pair's statistics, which the bootstrap draws),
teacher-forced accuracy (the share of reference tokens that are the model's first choice given the true prefix,
read through the decoding loop), the share of output words found in the source, output lengths, three samples.
The committed cells: bench/study/cells.jsonl; the cells of the earlier studies, whose choices were made on the
pairs they were scored on, are data in bench/study/superseded/. A run reads the cells done (--cells, OUT/cells.jsonl,
--cells_out) and runs the others, so a run cut by its time limit continues in the next and loses at most the cells
in flight. The scheduler runs JOBS, --per_gpu processes on each of --gpus GPUs (--mps: under CUDA's multi-process
service, so their kernels run side by side): a PRE-TRAINING per (system, seed), shared by the systems that reuse
it (packed and compiled; resumed from its checkpoint under --out/work on the same machine), a FINE-TUNING per cell
once its pre-training (and, for a final, its selection) is done. --data_dir holds corpus/, gigaword10k/ and
squad_qg/ (../shared/data's layout). What the study measured: bench/RESULTS.md, "The study".
--tiny: the tiny preset, the embedded corpus and docsum task (dev: its validation split), pmlm, palm and pmlm's
control, a grid of 2 lrs x 2 length penalties, one seed, a few steps.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils import UsageError, atomic_write, exit_with_error, read_lines  # noqa: E402

PROG = "study.py"
HERE = ROOT / "bench" / "study"
CELLS = HERE / "cells.jsonl"
# the earlier studies' cells (fine-tuning lr 3e-4, and 1e-3 with its recipe search, and one-off variants): every
# choice in them was made on the pairs they were scored on
SUPERSEDED = {"ft-lr-3e-4.jsonl": "fine-tuning peak lr 3e-4", "ft-lr-1e-3.jsonl": "fine-tuning peak lr 1e-3"}


def system(objective, control=False, pre=None, ft=None, pretrained_as=None, ablation_of=None, seeds=None):
    """One system: its objective, pre-training options (none for a control), fine-tuning options that replace its
    parent's chosen ones (train.py's flags), the system whose pre-training it reuses, the system it varies (whose
    choice it takes; a system without one is tuned on the grid), its seeds (else --seeds')."""
    return dict(objective=objective, control=control, pre=pre or {}, ft=ft or {}, pretrained_as=pretrained_as,
                ablation_of=ablation_of, seeds=seeds)


SYSTEMS = {
    # the four objectives and their controls: each tuned on the grid
    "unilm": system("unilm"),
    "pmlm": system("pmlm"),
    "ernie_gen": system("ernie_gen"),
    "palm": system("palm"),
    "unilm/no pre-training": system("unilm", control=True),
    "pmlm/no pre-training": system("pmlm", control=True),
    "ernie_gen/no pre-training": system("ernie_gen", control=True),
    "palm/no pre-training": system("palm", control=True),
    # the papers' ablations that are cheap here, at their parent's choice
    "unilm/no seq2seq LM": system("unilm", pre=dict(weight_seq2seq=0.0), ablation_of="unilm"),
    # UniLMv2 4.6, Table 6 "- PAR" (its row also drops the relative bias; ours keeps it)
    "pmlm/AE only": system("pmlm", pre=dict(par=False), ablation_of="pmlm"),
    "ernie_gen/no span flow": system("ernie_gen", pre=dict(lam_pretrain=1.0), ablation_of="ernie_gen"),  # Table 7
    "ernie_gen/no noise": system("ernie_gen", pre=dict(rho_p=0.0), ft=dict(rho_f=0.0), ablation_of="ernie_gen"),
    "palm/no copy": system("palm", pre=dict(copy=False), ft=dict(copy=False), ablation_of="palm"),      # Table 6
    "palm/no copy/no pre-training": system("palm", control=True, ft=dict(copy=False),
                                           ablation_of="palm/no pre-training"),
    # where ERNIE-GEN's gap is: its fine-tuning and infilling decoding on pmlm's pre-trained weights ([ATTN] starts
    # untrained there), pmlm's on ERNIE-GEN's (no relative bias: a checkpoint fixes the shapes), one seed each; and
    # ERNIE-GEN pre-trained with pmlm's relative position bias, which separates the objective from that bias
    "ernie_gen/ft from pmlm": system("ernie_gen", pretrained_as="pmlm", ablation_of="ernie_gen", seeds=(0,)),
    "pmlm/ft from ernie_gen": system("pmlm", pretrained_as="ernie_gen", ablation_of="pmlm", seeds=(0,)),
    "ernie_gen/relative bias": system("ernie_gen", pre=dict(rel_pos_buckets=32), ablation_of="ernie_gen"),
}
OBJECTIVES = ("unilm", "pmlm", "ernie_gen", "palm")
TINY_SYSTEMS = ("pmlm", "palm", "pmlm/no pre-training")
TASKS = {
    "gigaword": dict(title="Gigaword 10k", metrics=("rouge1", "rouge2", "rougeL"), main="rougeL"),
    "squad_qg": dict(title="SQuAD QG", metrics=("bleu", "rougeL"), main="bleu"),
    "docsum": dict(title="docsum", metrics=("rouge1", "rouge2", "rougeL"), main="rougeL"),
}
# the pairs of each part of a task (the code checks the data against them): selection fine-tunes on "select" and
# scores "dev"; the finals fine-tune on select + dev (every training pair) and score "test"
SPLITS = {"gigaword": dict(select=9000, dev=1000, test=1000), "squad_qg": dict(select=8456, dev=1057, test=1057)}
NAMES = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "bleu": "BLEU-4"}
# colours per objective (the notebook's pictures)
COLORS = {"unilm": "tab:blue", "pmlm": "tab:orange", "ernie_gen": "tab:green", "palm": "tab:red"}

# --- the grid: every objective and every control is chosen among the same number of configurations -----------
# each objective's own corruption of the target in fine-tuning: its recipe's value (ERNIE-GEN's Table 1 gives one a
# task), then a lower one; PALM corrupts nothing, so label smoothing (train.py's 0.1, then none) stands in
TARGET = {"unilm": ("target_mask_prob", 0.7, 0.4, "UniLM 2.5's"),
          "pmlm": ("target_noise_prob", 0.5, 0.2, "the official s2s-ft's"),
          "ernie_gen": ("rho_f", {"gigaword": 0.5, "squad_qg": 0.7, "docsum": 0.7}, 0.2, "Table 1's, by task"),
          "palm": ("label_smoothing", 0.1, 0.0, "train.py's; PALM corrupts no target, so label smoothing stands in")}


def num(x):
    """A setting as written: 3e-4, 0.2, 1."""
    return f"{x:.0e}".replace("e-0", "e-") if 0 < x < 0.01 else f"{x:g}"


def grid(name, task, cfg):
    """[(configuration, train.py options)] of the fine-tunings a system is chosen among on a task; each is decoded
    at every length penalty of cfg["grid"]["lp"]."""
    g = cfg["grid"]
    knob, paper, lower, _ = TARGET[SYSTEMS[name]["objective"]]
    values = [paper[task] if isinstance(paper, dict) else paper, lower][:g["target"]]
    return [(f"lr {num(lr)} {knob} {num(v)} dropout {num(d)}", {"lr": lr, knob: v, "dropout": d})
            for lr in g["lr"] for v in values for d in g["dropout"]]


def configurations(name, task, cfg):
    """How many configurations the tuned system behind `name` was chosen among: fine-tunings x length penalties."""
    return len(grid(tuned(name), task, cfg)) * len(cfg["grid"]["lp"])


def tuned(name):
    """The system whose choice `name` fine-tunes with: itself if it is tuned on the grid, else its parent's."""
    parent = SYSTEMS[name]["ablation_of"]
    return name if parent is None else tuned(parent)


# --- the settings of a study --------------------------------------------------------------------

def settings(args):
    """Model, budget, data and grid of the study (or of its --tiny run); recorded in every cell."""
    if args.tiny:
        # a smoke run of the whole protocol (CI's tests/test_study.py): the fewest steps that still pre-train the
        # two objectives in different numbers of steps, the smallest grid that is still a choice
        return dict(preset="tiny", vocab=2048, corpus_tokens=12_000, seq_len=96, batch=16, lr=1e-3,
                    ft_steps=8, ft_batch=8, tasks=["docsum"], n_score=8, seeds=1,
                    grid=dict(lr=[1e-3, 3e-3], target=1, dropout=[0.0], lp=[1.0, 2.0]))
    return dict(preset="small", vocab=16384, corpus_tokens=40_000_000, seq_len=256, batch=128, lr=7e-4,
                ft_steps=1500, ft_batch=64, tasks=args.tasks, n_score=None, seeds=args.seeds,
                grid=dict(lr=[3e-4, 1e-3], target=2, dropout=[0.1, 0.2], lp=[0.6, 1.0, 1.5, 2.0]))


def settings_key(cfg):
    return {k: v for k, v in cfg.items() if k not in ("tasks", "n_score", "seeds")}


def corpus_path(cfg, args):
    return None if cfg["preset"] == "tiny" else str(Path(args.data_dir) / "corpus")


def systems_of(args):
    """The systems of this run: --only's (any subset, in SYSTEMS order) or all."""
    pool = TINY_SYSTEMS if args.tiny else tuple(SYSTEMS)
    if not args.only:
        return list(pool)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SYSTEMS]
    if unknown:
        raise UsageError(f"--only: unknown system(s) {unknown}; known: {', '.join(SYSTEMS)}")
    return [s for s in SYSTEMS if s in wanted]


def wanted_cells(names, tasks, seeds=3):
    """(system, task, seed) of every final (test) cell these systems should have."""
    return [(n, t, k) for n in names for k in range(seeds)
            if SYSTEMS[n]["seeds"] is None or k in SYSTEMS[n]["seeds"] for t in tasks]


def grid_cells(names, tasks, cfg):
    """(system, task, 0, configuration) of every dev cell the choices of these systems need."""
    owners = dict.fromkeys(tuned(n) for n in names)
    return [(o, t, 0, config) for o in owners for t in tasks for config, _ in grid(o, t, cfg)]


def slug(name):
    """A name as a file name: 'ernie_gen/no span flow' -> 'ernie_gen-no-span-flow'."""
    return re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-")


def cell_stem(name, task, seed, config=None):
    """A cell's name: a final's is system, task and seed; a dev cell's adds its configuration."""
    return f"{slug(name)}__{task}__seed{seed}" + (f"__{slug(config)}" if config else "")


def stem_of(cell):
    return cell_stem(cell["system"], cell["task"], cell["seed"], cell.get("config"))


# --- the splits ------------------------------------------------------------------------------------------

def sentence_cut(sources, share):
    """The line at `share` of the lines, moved forward past the questions on the same source sentence."""
    cut = int(share * len(sources))
    while cut < len(sources) and sources[cut] == sources[cut - 1]:
        cut += 1
    return cut


def task_pairs(task, cfg, args):
    """{"select", "dev", "final", "test"}: a task's (source, target) pairs. Gigaword: its 10,000 training pairs
    less the last 1,000 (dev); test: its 1,000 validation pairs. SQuAD QG (Du et al.'s dev file, 10,570 lines,
    question after question on a source sentence, paragraph after paragraph): test is its last tenth, dev the
    tenth before, each cut between two source sentences. docsum (--tiny): its own train / valid / test splits."""
    if task == "docsum":
        import data
        parts = data.default_seq2seq(args.cache_dir)
        select, dev, test = parts["train"], parts["valid"], parts["test"]
    elif task == "gigaword":
        folder = Path(args.data_dir) / "gigaword10k"
        train = list(zip(read_lines(folder / "train.article.txt"), read_lines(folder / "train.title.txt")))
        test = list(zip(read_lines(folder / "valid.article.txt"), read_lines(folder / "valid.title.txt")))
        select, dev = train[:-SPLITS[task]["dev"]], train[-SPLITS[task]["dev"]:]
    else:
        folder = Path(args.data_dir) / "squad_qg"
        src, tgt = read_lines(folder / "src-dev.txt"), read_lines(folder / "tgt-dev.txt")
        dev_cut, test_cut = sentence_cut(src, 0.8), sentence_cut(src, 0.9)
        pairs = list(zip(src, tgt))
        select, dev, test = pairs[:dev_cut], pairs[dev_cut:test_cut], pairs[test_cut:]
    parts = dict(select=select, dev=dev, final=select + dev, test=test)
    sizes = {k: len(parts[k]) for k in ("select", "dev", "test")}
    if task in SPLITS and sizes != SPLITS[task]:
        raise UsageError(f"--data_dir {args.data_dir}: {task} splits into {sizes} pairs; the study's splits are "
                         f"defined on {SPLITS[task]} (../shared/data's files)")
    return parts


def split_file(task, part, args):
    """Where a part of a task is written (prepare()): train.py reads select/train.jsonl with its sibling
    select/dev.jsonl (its held-out loss) or final/train.jsonl alone; scoring reads dev or test."""
    folder = Path(args.out) / "splits" / task
    return folder / {"select": "select/train.jsonl", "dev": "select/dev.jsonl", "final": "final/train.jsonl",
                     "test": "test.jsonl"}[part]


def read_pairs(path, n=None):
    """(sources, references) of a written part, its first n pairs where n is given."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()][:n]
    return [r["src"] for r in rows], [" ".join(r["tgt"].split()) for r in rows]


# --- the cells: JSON-lines files, one cell a line ---------------------------------------------------------

def read_cells(path):
    """{stem: cell} of a .jsonl file of cells (a later line replaces an earlier one of the same stem), or {}
    where there is no such file."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: a folder; cells are one .jsonl file (one cell a line)")
    cells = {}
    if not path.is_file():
        return cells
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                cell = json.loads(line)
                cells[stem_of(cell)] = cell
            except (ValueError, KeyError) as e:
                raise UsageError(f"{path}:{n}: not a cell ({e})") from None
    return cells


def write_cell(store, cell):
    """Add a finished cell to a store: a line at the end of the .jsonl file."""
    store = Path(store)
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store, "a", encoding="utf-8") as f:
        f.write(json.dumps(cell) + "\n")


def save_cells(path, cells):
    """Write {stem: cell} as a .jsonl file, one cell a line sorted by stem (a new cell is a one-line diff)."""
    atomic_write(path, "".join(json.dumps(cells[k]) + "\n" for k in sorted(cells)))


def done_cells(stores, cfg):
    """The finished cells of these stores that were run with these settings."""
    cells = {}
    for store in stores:
        if store:
            cells.update(read_cells(store))
    other = [k for k, c in cells.items() if c.get("settings") != settings_key(cfg)]
    if other:
        print(f"{len(other)} cell(s) ran with other settings: ignored (e.g. {other[0]})")
    return {k: c for k, c in cells.items() if k not in other}


def superseded_cells():
    """{label: cells} of the earlier studies (bench/study/superseded/)."""
    return {label: read_cells(HERE / "superseded" / name) for name, label in SUPERSEDED.items()}


# --- selection: on dev only -------------------------------------------------------------------------------

def choose(cells, name, task, cfg):
    """The choice `name` fine-tunes with on a task (its tuned system's): the configuration and length penalty of
    the highest dev score in the task's main metric (the first in grid order among equals), as dict(system,
    config, options, lp, dev, among); None until every configuration has its dev cell. Only dev scores are read: a
    grid cell scored on any other split is refused."""
    owner = tuned(name)
    main = TASKS[task]["main"]
    found = []
    for config, options in grid(owner, task, cfg):
        stem = cell_stem(owner, task, 0, config)
        cell = cells.get(stem)
        if cell is None:
            return None
        if cell.get("split") != "dev":
            raise UsageError(f"selection reads dev scores only: cell {stem} holds scores of the "
                             f"{cell.get('split') or 'unrecorded'} split")
        for lp, got in ({} if cell.get("diverged") else cell["by_lp"]).items():
            found.append((got[main], config, options, float(lp)))
    among = configurations(owner, task, cfg)
    if not found:
        # every configuration diverged on dev: the first, with no dev score
        config, options = grid(owner, task, cfg)[0]
        return dict(system=owner, config=config, options=options, lp=cfg["grid"]["lp"][0], dev=None, among=among)
    dev, config, options, lp = max(found, key=lambda row: row[0])
    return dict(system=owner, config=config, options=options, lp=lp, dev=dev, among=among)


# --- a pre-training job -------------------------------------------------------------------------

def train_flags(cfg, objective, out, cache, args, compile, pack):
    flags = ["--objective", objective, "--preset", cfg["preset"], "--vocab_size", str(cfg["vocab"]),
             "--cache_dir", cache, "--out_dir", str(out), "--progress", "false",
             "--overwrite", "true", "--eval_interval", "1000000", "--eval_batches", "1",
             "--log_interval", "50", "--compile", compile, "--pack", pack]
    if args.workers >= 0:
        flags += ["--workers", str(args.workers)]
    return flags


def packed(pack):
    """Whether train.py packs a job's batches (--pack or --ft_pack, on train.py's default device): a
    layout, not a setting (the same per-token losses), so a cell and a pre-training record it but the
    study's settings leave it out."""
    import train
    from utils import pick_device
    return train.switched_on(pack, pick_device())


def option_flags(options):
    """A system's options as train.py flags; they come last, so they win over the study's."""
    flags = []
    for key, value in options.items():
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def pre_dir(args, name, seed):
    return Path(args.out) / "work" / f"{slug(name)}-s{seed}" / "pre"


def pretrain_steps(cfg, objective, options, cache, seed, corpus):
    """-> (steps that read cfg["corpus_tokens"] corpus tokens with this objective, training FLOPs per
    step), both measured on real batches: the same reading for every objective."""
    import data
    tok, splits, _ = data.prepare_pretrain(corpus, cfg["vocab"], cache,
                                           max_tokens=cfg["seq_len"] - 3, progress=False)
    obj, model = objective_and_model(cfg, objective, tok, "pretrain", options)
    rng = random.Random(seed)
    batches = [obj.make_batch(rng.sample(splits["train"], cfg["batch"]), rng) for _ in range(5)]
    corpus_tokens = statistics.mean(obj.corpus_tokens(b) for b in batches)
    return max(1, round(cfg["corpus_tokens"] / corpus_tokens)), flops_per_step(model, batches)


def objective_and_model(cfg, objective, tok, task, options):
    import config
    import model as M
    from objectives import get_objective
    shape = M.PRESETS[cfg["preset"]]
    # an option is the model's (e.g. rel_pos_buckets) or the objective's
    fields = config.model_fields()
    model_options = {k: v for k, v in options.items() if k in fields}
    obj = get_objective(objective, tok, task=task, max_len=shape["max_position"],
                        **{k: v for k, v in options.items() if k not in fields})
    obj.set_step(10 ** 9, 10 ** 9)
    config = M.ModelConfig(**{**shape, **obj.model_defaults, **model_options,
                              "vocab_size": len(tok)})
    return obj, M.Transformer(config)


def flops_per_step(model, batches):
    """Mean training FLOPs of these batches (model.estimate_flops per token, at their length)."""
    per_batch = []
    for b in batches:
        predicted = int((b.labels != -100).sum()) / b.n_tokens
        per_batch.append(b.n_tokens * model.estimate_flops(b.input_ids.size(1), predicted))
    return statistics.mean(per_batch)


def run_pretraining(name, seed, cfg, args):
    """Pre-train a system once per seed (resuming a run stopped by the time limit); its record goes to
    pre/done.json, which the fine-tuning jobs read."""
    import train
    spec = SYSTEMS[name]
    folder = pre_dir(args, name, seed)
    if (folder / "done.json").exists():
        return
    cache = args.cache_dir
    corpus = corpus_path(cfg, args)
    options = dict(spec["pre"])
    if spec["objective"] == "ernie_gen":
        # the span flow's spans, as train.py will cut them
        options["span_vocab"] = prepare(cfg, args, ernie=True)
    steps, flops = pretrain_steps(cfg, spec["objective"], options, cache, seed, corpus)
    # the seconds of earlier, interrupted parts of this pre-training
    partial = folder / "partial.json"
    seconds = json.loads(partial.read_text())["seconds"] if partial.exists() else 0.0
    if (folder / "ckpt.pt").exists():
        flags = ["--resume", "--out_dir", str(folder), "--progress", "false", "--cache_dir", cache,
                 "--compile", args.compile, "--pack", args.pack]
    else:
        flags = train_flags(cfg, spec["objective"], folder, cache, args, args.compile, args.pack)
        flags += ["--max_steps", str(steps), "--seq_len", str(cfg["seq_len"]), "--batch_size",
                  str(cfg["batch"]), "--lr", str(cfg["lr"]), "--seed", str(seed)]
        flags += ["--data", corpus] if corpus else []
        flags += option_flags(spec["pre"])
    t0 = time.time()
    try:
        train.main(flags)
    finally:
        # stopped or not, the time spent counts
        atomic_write(partial, json.dumps({"seconds": seconds + time.time() - t0}))
    seconds += time.time() - t0
    atomic_write(folder / "done.json", json.dumps(dict(steps=steps, seconds=seconds,
                                                       flops=steps * flops, packed=packed(args.pack))))


# --- a fine-tuning job: one cell ------------------------------------------------------------------

def job_spec(job, cfg, cells):
    """What a fine-tuning job runs, resolved by the scheduler: a dev job ("ft", system, task, 0, configuration)
    its grid options, decoded on dev at every length penalty; a final ("ft", system, task, seed) its tuned
    system's choice (the system's own fine-tuning options over it), decoded on test at the chosen penalty."""
    name, task, seed = job[1:4]
    if len(job) == 5:
        options = dict(grid(name, task, cfg))[job[4]]
        return dict(system=name, task=task, seed=seed, split="dev", config=job[4], options=options,
                    lps=cfg["grid"]["lp"])
    chosen = choose(cells, name, task, cfg)
    options = {**chosen.pop("options"), **SYSTEMS[name]["ft"]}
    return dict(system=name, task=task, seed=seed, split="test", chosen=chosen, options=options,
                lps=[chosen["lp"]])


def run_cell(spec, cfg, args):
    """Fine-tune (from the pre-training, or from random weights for a control), decode, score -> the cell,
    written to --out/staged/ for the scheduler to collect."""
    name, task, seed, split = spec["system"], spec["task"], spec["seed"], spec["split"]
    system_ = SYSTEMS[name]
    stem = cell_stem(name, task, seed, spec.get("config"))
    out = Path(args.out) / "work" / f"{slug(name)}-s{seed}" / f"ft-{stem.split('__', 1)[1]}"
    part = "select" if split == "dev" else "final"
    flags = train_flags(cfg, system_["objective"], out, args.cache_dir, args, args.ft_compile, args.ft_pack)
    flags += ["--task", "seq2seq", "--max_steps", str(cfg["ft_steps"]), "--batch_size", str(cfg["ft_batch"]),
              "--seed", str(seed), "--data", str(split_file(task, part, args))]
    flags += option_flags(spec["options"])
    pre = None
    if not system_["control"]:
        folder = pre_dir(args, system_["pretrained_as"] or name, seed)
        pre = json.loads((folder / "done.json").read_text())
        flags += ["--init_from", str(folder / "ckpt.pt")]
    else:
        flags += ["--vocab", vocab_file(cfg, args)]
    cell = dict(system=name, task=task, seed=seed, split=split, objective=system_["objective"],
                settings=settings_key(cfg), options=dict(pre=system_["pre"], ft=spec["options"]),
                pretrained_as=system_["pretrained_as"], pretrain=pre)
    cell.update({k: spec[k] for k in ("config", "chosen") if k in spec})
    t0 = time.time()
    attn = fine_tune(flags, args)
    cell["finetune"] = dict(steps=cfg["ft_steps"], seconds=time.time() - t0, packed=packed(args.ft_pack), attn=attn)
    staged = Path(args.out) / "staged" / f"{stem}.json"
    if attn is None:
        # the loss went non-finite on both attentions: the same seed would again, so the cell is done, unscored
        cell["diverged"] = True
        atomic_write(staged, json.dumps(cell))
        return
    if split == "test":
        ft_batch = spec["options"].get("batch_size", cfg["ft_batch"])
        cell["finetune"]["flops"] = cfg["ft_steps"] * finetune_flops(out / "ckpt.pt", task, ft_batch, args)
    cell.update(score(out / "ckpt.pt", task, split, spec["lps"], cfg, args))
    atomic_write(staged, json.dumps(cell))
    # the cell holds all the study reads; a checkpoint with its optimizer state (0.34 GB for the small model) a cell
    # would fill the disk
    (out / "ckpt.pt").unlink(missing_ok=True)


def fine_tune(flags, args):
    """train.py on these flags, on --ft_attn's attention; a loss gone non-finite on SDPA runs again on the
    written-out attention, the same function (some controls at lr 1e-3 stopped on a NaN on SDPA's cuDNN kernel in
    10 of 14 runs, in none of 10 written out: bench/RESULTS.md, the study). -> the attention that finished, or
    None where it diverged on both."""
    import train
    for attn in dict.fromkeys([args.ft_attn, "naive"]):
        try:
            train.main(flags + ["--attn_impl", attn])
            return attn
        except SystemExit as e:
            if e.code != train.DIVERGED:
                raise
    return None


def vocab_file(cfg, args):
    """The study's vocabulary as a file (a control starts from random weights but reads the same pieces)."""
    path = Path(args.cache_dir) / f"study-vocab-{cfg['vocab']}.txt"
    if not path.exists():
        prepare(cfg, args, ernie=False)
    return str(path)


def prepare(cfg, args, ernie, progress=False):
    """The caches every job reads, built once before the jobs start (not by 4 x K processes at once): the
    vocabulary and the tokenized corpus, ERNIE-GEN's span vocabulary, each task's parts as files and their
    tokenized training pairs. -> the span vocabulary's path."""
    import data
    tok, splits, info = data.prepare_pretrain(corpus_path(cfg, args), cfg["vocab"], args.cache_dir,
                                              max_tokens=cfg["seq_len"] - 3, progress=progress)
    tok.save(Path(args.cache_dir) / f"study-vocab-{cfg['vocab']}.txt")
    # where train.py looks for it (train.load_data)
    spans = Path(info["cache_path"]) / "span_vocab.json"
    if ernie:
        from objectives.ernie_gen import build_span_vocab
        build_span_vocab(splits["train"], tok, cache_path=spans, progress=progress)
    for task in cfg["tasks"]:
        if split_file(task, "test", args).exists():
            continue
        for part, pairs in task_pairs(task, cfg, args).items():
            atomic_write(split_file(task, part, args),
                         "".join(json.dumps(dict(src=s, tgt=t)) + "\n" for s, t in pairs))
        for part in ("select", "final"):
            data.prepare_seq2seq(str(split_file(task, part, args)), tok, args.cache_dir, progress=False)
    return str(spans)


def finetune_flops(ckpt, task, ft_batch, args):
    """Training FLOPs of one fine-tuning step, on 5 batches of the task's training pairs."""
    import data
    import generate
    model, tok, obj = generate.load_checkpoint(str(ckpt))
    pairs = data.read_seq2seq(str(split_file(task, "final", args)))
    rng = random.Random(0)
    encoded = [(tok.encode(s), tok.encode(t)) for s, t in rng.sample(pairs, 5 * ft_batch)]
    batches = [obj.make_batch(encoded[i::5], rng) for i in range(5)]
    return flops_per_step(model, batches)


def score(ckpt, task, split, lps, cfg, args):
    """Decode a split's sources at each length penalty and score them. Dev: the scores and output lengths at each
    penalty (what selection reads). Test, at one penalty: the scores, each pair's statistics of the task's main
    metric (what the bootstrap draws), teacher-forced accuracy, the share of output words found in the source,
    output lengths, three samples."""
    import torch
    import generate
    sources, refs = read_pairs(split_file(task, split, args), cfg["n_score"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok, obj = generate.load_checkpoint(str(ckpt), device)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")
    t0 = time.time()
    outputs = {}
    for lp in lps:
        with autocast:
            outputs[lp] = generate.generate_text(model, tok, obj, sources, beam_size=5, max_len=32,
                                                 length_penalty=lp, batch_size=64)
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    result = dict(n_pairs=len(refs), torch=torch.__version__, card=card)
    if split == "dev":
        by_lp = {f"{lp:g}": dict(metrics(hyps, refs), words=mean_words(hyps)) for lp, hyps in outputs.items()}
        return dict(result, by_lp=by_lp, decode=dict(seconds=time.time() - t0))
    (hyps,) = outputs.values()
    with autocast:
        accuracy = teacher_forced_accuracy(model, tok, obj, sources, refs)
    # how much of what the system writes it takes from the source, and how long it writes (the references beside)
    decoded = dict(seconds=time.time() - t0, copied=dict(outputs=copy_rate(hyps, sources),
                                                          references=copy_rate(refs, sources)),
                   words=dict(outputs=mean_words(hyps), references=mean_words(refs)))
    return dict(result, lp=lps[0], scores={m: dict(f=v) for m, v in metrics(hyps, refs).items()},
                pairs=pair_stats(hyps, refs, TASKS[task]["main"]), teacher_forced_acc=accuracy, decode=decoded,
                examples=[dict(source=s, reference=r, output=h) for s, r, h in zip(sources, refs, hyps)][:3])


def metrics(hyps, refs):
    """ROUGE-1/2/L F1 (mean over pairs, stemmed) and corpus BLEU-4 (13a), in percent."""
    import evaluate
    rouge = evaluate.rouge(hyps, refs, stem=True)
    return {**{k: 100 * rouge[k]["fmeasure"] for k in ("rouge1", "rouge2", "rougeL")},
            "bleu": evaluate.bleu(hyps, refs)}


def pair_stats(hyps, refs, metric):
    """Each pair's share of a metric: its ROUGE-L F1 (percent; the score is their mean), or BLEU's sufficient
    statistics [output length, reference length, matched 1- to 4-grams] (the score is BLEU of their sums)."""
    import evaluate
    if metric == "rougeL":
        return [round(100 * evaluate.rouge_scores(h, r, stem=True)["rougeL"]["fmeasure"], 4)
                for h, r in zip(hyps, refs)]
    stats = [evaluate.bleu_details([h], [r]) for h, r in zip(hyps, refs)]
    return [[s["sys_len"], s["ref_len"], *s["counts"]] for s in stats]


def mean_words(texts):
    """Mean number of words (split on spaces, as scored) a text."""
    return sum(len(t.split()) for t in texts) / max(1, len(texts))


def copy_rate(texts, sources):
    """Percent of the words of texts (split on spaces, as scored) that occur in their source."""
    inside = total = 0
    for text, source in zip(texts, sources):
        words, seen = text.split(), set(source.split())
        inside += sum(word in seen for word in words)
        total += len(words)
    return 100 * inside / max(1, total)


def teacher_forced_accuracy(model, tok, obj, sources, refs, batch_size=64):
    """Share of reference tokens (and the final [EOS]) that are the model's top choice given the
    source and the reference's prefix, read at the decoding loop's query (generate.Decoder)."""
    import torch
    import generate
    from objectives import pad
    limit = generate.max_source_len(model, 32)
    pairs = [(tok.encode(s)[:limit], tok.encode(r)[:31] + [tok.eos_id])
             for s, r in zip(sources, refs) if s.strip()]
    right = total = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        dec = generate.Decoder(model, obj, [s for s, _ in chunk], 32)
        forced = pad([t for _, t in chunk], tok.eos_id).to(dec.src_ids.device)   # (N, T)
        lengths = torch.tensor([len(t) for _, t in chunk], device=forced.device)
        for t in range(forced.size(1)):
            hit = dec.logprobs().argmax(-1) == forced[:, t]
            real = t < lengths
            right += int((hit & real).sum())
            total += int(real.sum())
            dec.append(forced[:, t])
    return 100 * right / max(1, total)


# --- the scheduler: K processes per GPU, a time limit, resumable ------------------------------------

def plan(todo, args, seconds=None):
    """Jobs for the missing cells: ("pre", system, seed) for each pre-training they need that is not done on
    this machine, then ("ft", *cell) per cell (a dev cell's tuple ends with its configuration). seconds: a
    pre-training's wall time in earlier cells, by system (pretrain_seconds), to start the longest of a seed first."""
    pres = []
    for cell in todo:
        spec = SYSTEMS[cell[0]]
        job = ("pre", spec["pretrained_as"] or cell[0], cell[2])
        done = (pre_dir(args, *job[1:]) / "done.json").exists()
        if not spec["control"] and job not in pres and not done:
            pres.append(job)
    # seed 0 of every system first (the choices need it); within a seed the longest first, so the last to start
    # are short (a long one started late sets the wall time)
    seconds = seconds or {}
    pres.sort(key=lambda j: (j[2], -seconds.get(j[1], 0.0)))
    return pres + [("ft", *cell) for cell in sorted(todo, key=lambda c: (c[2], len(c) == 3))]


def pretrainings(cells):
    """{(system pre-trained, seed): its pre-training's record}, once each (its cells share it)."""
    return {(c.get("pretrained_as") or c["system"], c["seed"]): c["pretrain"] for c in cells.values()
            if c.get("pretrain")}


def pretrain_seconds(cells):
    """{system: mean wall seconds of its pre-training} over these cells (of any settings)."""
    runs_ = {}
    for (name, _), record in pretrainings(cells).items():
        runs_.setdefault(name, []).append(record["seconds"])
    return {name: statistics.mean(seconds) for name, seconds in runs_.items()}


def ready(job, args, cells, cfg):
    """A pre-training can start at once; a fine-tuning once its pre-training is done (a control at once) and,
    for a final, once its tuned system's choice is made (every dev cell of its grid is in)."""
    if job[0] == "pre":
        return True
    if not SYSTEMS[job[1]]["control"] and not (pre_dir(args, *pre_of(job)[1:]) / "done.json").exists():
        return False
    return len(job) == 5 or choose(cells, job[1], job[2], cfg) is not None


def next_job(jobs, args, cells, cfg):
    """The first ready job of the highest rank, else None: a final (it finishes a cell, and the page needs
    it), a dev cell of a pre-trained system (choices gate finals), a pre-training (the longest job; it gates
    cells, and is lost at the limit on a fresh machine), then a control's dev cell (it needs nothing)."""
    def rank(job):
        if job[0] == "pre":
            return 2
        return 0 if len(job) == 4 else 3 if SYSTEMS[job[1]]["control"] else 1
    waiting = [j for j in jobs if ready(j, args, cells, cfg)]
    return min(waiting, key=rank) if waiting else None


def schedule(jobs, args, store, cells, cfg):
    """Run the jobs, --per_gpu at a time on each GPU (--gpus 0: on the CPU); cells: those done, to which each
    new cell is added (the choices read them). At --time_limit_min (or after --stop_after_cells new cells) no
    job starts and those in flight are stopped (a pre-training checkpoints, and resumes next time on this
    machine). -> the number of new cells."""
    free = list(range(max(1, args.gpus) * args.per_gpu))
    running = {}
    deadline = time.time() + 60 * args.time_limit_min if args.time_limit_min else None
    new_cells = 0
    # seconds of each finished job: their sum over the wall time is how many ran at once
    busy = []
    stopped = []
    start = time.time()
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # a SIGTERM (a machine's time limit) stops the jobs as Ctrl-C does
    signal.signal(signal.SIGTERM, interrupt)
    try:
        while jobs or running:
            out_of_time = deadline is not None and time.time() > deadline
            if out_of_time or (args.stop_after_cells and new_cells >= args.stop_after_cells):
                why = "time limit" if out_of_time else f"{new_cells} new cell(s)"
                print(f"{why} reached: {len(running)} job(s) in flight stopped, {len(jobs)} not "
                      "started", flush=True)
                # their minutes count too: the GPUs were busy with them (a stopped pre-training resumes)
                stopped = [time.time() - t0 for _, _, t0 in running.values()]
                stop_all(running)
                break
            while free and (job := next_job(jobs, args, cells, cfg)):
                jobs.remove(job)
                slot = free.pop(0)
                payload = job if job[0] == "pre" else job_spec(job, cfg, cells)
                running[start_job(job, payload, slot, args, logs)] = (job, slot, time.time())
            if not running:
                print(f"{len(jobs)} job(s) cannot run: a pre-training or a choice they need failed", flush=True)
                break
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                if args.stop_after_cells and new_cells >= args.stop_after_cells:
                    break              # exactly that many cells: the others count as in flight
                job, slot, t0 = running.pop(proc)
                free.append(slot)
                busy.append(time.time() - t0)
                print(f"{job_name(job)}: {busy[-1] / 60:.1f} min", flush=True)
                new_cells += finished(job, proc.returncode, jobs, args, store, logs, cells)
    except KeyboardInterrupt:
        print("interrupted: the jobs in flight stopped; finished cells are kept", flush=True)
        stop_all(running)
        raise SystemExit(130)
    wall = time.time() - start
    print(f"{len(busy)} job(s) finished: {sum(busy) / 60:.1f} process-minutes in {wall / 60:.1f} min "
          f"of wall time; with the {len(stopped)} stopped at the limit "
          f"{(sum(busy) + sum(stopped)) / 60:.1f} process-minutes, "
          f"{(sum(busy) + sum(stopped)) / max(wall, 1e-9):.1f} at once on average", flush=True)
    return new_cells


def interrupt(signum, frame):
    raise KeyboardInterrupt


def finished(job, returncode, jobs, args, store, logs, cells):
    """After a job: collect its cell, or drop the cells that needed a failed pre-training. -> new
    cells (0 or 1)."""
    if returncode:
        log = logs / f"{job_name(job)}.log"
        tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
        print(f"failed (exit {returncode}): {job_name(job)}; {log} ends:\n  " + "\n  ".join(tail),
              flush=True)
        if job[0] == "pre":
            for j in [j for j in jobs if j[0] == "ft" and pre_of(j) == job]:
                jobs.remove(j)
                print(f"dropped {job_name(j)}: its pre-training failed", flush=True)
        return 0
    if job[0] == "pre":
        print(f"pre-trained {job[1]} seed {job[2]}", flush=True)
        return 0
    return collect(job, args, store, cells)


def pre_of(job):
    spec = SYSTEMS[job[1]]
    return ("pre", spec["pretrained_as"] or job[1], job[3])


def job_name(job):
    return "__".join([job[0], slug(job[1])] + [slug(str(x)) for x in job[2:]])


def start_job(job, payload, slot, args, logs):
    """A job's own process (`study.py job PAYLOAD`): a pre-training's job tuple, or a fine-tuning's job_spec."""
    env = {**os.environ, **getattr(args, "job_env", {}), "PYTHONUNBUFFERED": "1",
           "STUDY_SCHEDULER": str(os.getpid())}
    n_slots = max(1, args.gpus) * args.per_gpu
    # the CPU's threads shared among the jobs (or the scheduler's own OMP_NUM_THREADS where set:
    # several studies side by side share the CPU too)
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 2) // n_slots))
    if args.gpus:
        # slot -> one of the GPUs this run may use (CUDA_VISIBLE_DEVICES's where set: several
        # studies side by side, one a GPU)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        gpus = visible.split(",") if visible else [str(i) for i in range(args.gpus)]
        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % args.gpus]
    cmd = [sys.executable, __file__, "job", json.dumps(payload)] + forwarded(args)
    log = open(logs / f"{job_name(job)}.log", "w")
    print(f"start {job_name(job)} (slot {slot})", flush=True)
    # its own process group: a Ctrl-C in the terminal reaches the scheduler, which stops it
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def forwarded(args):
    """The flags a job needs to compute what its scheduler asked for."""
    flags = ["--out", args.out, "--data_dir", args.data_dir, "--cache_dir", args.cache_dir,
             "--compile", args.compile, "--ft_compile", args.ft_compile, "--pack", args.pack,
             "--ft_pack", args.ft_pack, "--workers", str(args.workers), "--tasks", ",".join(args.tasks),
             "--ft_attn", args.ft_attn]
    return flags + (["--tiny"] if args.tiny else [])


MPS_CONTROL = "nvidia-cuda-mps-control"


@contextmanager
def multi_process_service(args):
    """--mps: CUDA's multi-process service for the run, a control daemon with its own pipe and log
    folders (under /tmp: short paths), which the jobs reach through the two variables yielded; no GPU
    setting changes, and the daemon quits when the run ends, however it ends. Without --mps: {}.
    Why: processes sharing a GPU take turns, and each of this small model's kernels leaves most of
    the GPU idle; under the service their kernels run side by side (four pre-trainings on one H100 made 39.2
    steps/s together, against 29.8 for two without it: bench/RESULTS.md, the study)."""
    if not args.mps:
        yield {}
        return
    folder = Path(tempfile.mkdtemp(prefix="study-mps-"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
    for path in env.values():
        Path(path).mkdir()
    subprocess.run([MPS_CONTROL, "-d"], env={**os.environ, **env}, check=True)
    print(f"multi-process service started ({folder})", flush=True)
    try:
        yield env
    finally:
        subprocess.run([MPS_CONTROL], input="quit\n", text=True, env={**os.environ, **env})
        shutil.rmtree(folder, ignore_errors=True)
        print("multi-process service stopped", flush=True)


def stop_all(running, grace=30):
    """SIGTERM to every job (train.py checkpoints and stops at its next log step), then SIGKILL to the
    groups still there after grace seconds."""
    for proc in running:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    end = time.time() + grace
    while time.time() < end and any(p.poll() is None for p in running):
        time.sleep(0.2)
    for proc in running:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in running:
        proc.wait()


def collect(job, args, store, cells):
    """Move a finished cell from --out/staged into the --cells_out store and into cells."""
    stem = cell_stem(*job[1:])
    staged = Path(args.out) / "staged" / f"{stem}.json"
    if not staged.exists():
        print(f"no cell from {job}", flush=True)
        return 0
    cell = json.loads(staged.read_text())
    write_cell(store, cell)
    # and beside the work: a later run on this machine skips it even before an import
    if Path(store) != Path(args.out) / "cells.jsonl":
        write_cell(Path(args.out) / "cells.jsonl", cell)
    cells[stem] = cell
    staged.unlink()
    main = TASKS[cell["task"]]["main"]
    said = ("diverged" if cell.get("diverged") else f"test {NAMES[main]} {cell['scores'][main]['f']:.2f}"
            if cell["split"] == "test" else "dev " + ", ".join(f"lp {lp} {NAMES[main]} {got[main]:.2f}"
                                                               for lp, got in cell["by_lp"].items()))
    print(f"cell {stem}: {said}", flush=True)
    return 1


# --- the results: scores over seeds, intervals over test pairs and seeds -----------------------------------

DRAWS = 2000
# processes at once, on average, in a measured run of the study's jobs on a 4x H200 machine (--per_gpu 4 --mps):
# 234 process-minutes in 17.3 minutes of wall time (bench/RESULTS.md, the study); the time estimate divides by it
AT_ONCE = 13.5


def runs(cells, name, task, split="test"):
    """{seed: cell} of a system's scored cells on a task and split (a superseded cell, which records no split,
    was scored on what is the test split here)."""
    return {c["seed"]: c for c in cells.values() if c["system"] == name and c["task"] == task
            and c.get("split", "test") == split and not c.get("diverged") and "scores" in c}


def summary(cells, name, task, metric):
    """(mean, std, seeds) of a system's test scores in a metric over its seeds, or None."""
    values = [c["scores"][metric]["f"] for c in runs(cells, name, task).values()]
    if not values:
        return None
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def pair_rows(cell, metric):
    """(N, k) array of a test cell's pair statistics: ROUGE-L F1 (k = 1), or BLEU's output length, reference
    length, matched 1- to 4-grams and output 1- to 4-grams (k = 10)."""
    import numpy as np
    rows = np.asarray(cell["pairs"], dtype=np.float64)
    if metric == "rougeL":
        return rows[:, None]
    # an output of L tokens has max(L - n + 1, 0) n-grams
    grams = np.stack([np.maximum(rows[:, 0] - n, 0) for n in range(4)], axis=1)
    return np.concatenate([rows, grams], axis=1)


def metric_of(sums, n, metric):
    """The metric of each row of summed pair statistics (rows of pair_rows, summed over n pairs)."""
    import numpy as np
    import evaluate
    if metric == "rougeL":
        return sums[:, 0] / n
    return np.array([evaluate.bleu_from_stats(list(s[2:6]), list(s[6:10]), s[0], s[1])["score"] for s in sums])


def interval(cells, name, task, base=None, draws=DRAWS, seed=0):
    """(estimate, low, high, seeds) of a system's test score in the task's main metric, or of its difference from
    base (its control, its parent): the mean over seeds of each seed's score (minus base's on the same seed and
    pairs), with a 95% percentile bootstrap that draws the test pairs and the seeds with replacement, one draw for
    both systems (paired). Only the seeds both ran count; None where there are none."""
    import numpy as np
    metric = TASKS[task]["main"]
    sides = [runs(cells, n, task) for n in (name, base) if n]
    seeds = sorted(set.intersection(*(set(side) for side in sides)))
    if not seeds or any("pairs" not in side[k] for side in sides for k in seeds):
        return None
    rows = [[pair_rows(side[k], metric) for k in seeds] for side in sides]
    n = len(rows[0][0])
    if any(len(r) != n for side in rows for r in side):
        raise UsageError(f"{name}, {task}: cells scored on different numbers of test pairs")
    rng = np.random.default_rng(seed)
    # how often each pair is drawn, a row a draw (N draws with replacement), and the seeds each draw takes
    counts = rng.multinomial(n, np.full(n, 1 / n), size=draws).astype(np.float64)
    picks = rng.integers(0, len(seeds), size=(draws, len(seeds)))
    point, drawn = 0.0, np.zeros(draws)
    for sign, side in zip((1, -1), rows):
        point += sign * statistics.mean(float(metric_of(r.sum(0, keepdims=True), n, metric)[0]) for r in side)
        per_seed = np.stack([metric_of(counts @ r, n, metric) for r in side], axis=1)       # (draws, seeds)
        drawn += sign * np.take_along_axis(per_seed, picks, axis=1).mean(axis=1)
    low, high = np.percentile(drawn, [2.5, 97.5])
    return point, float(low), float(high), len(seeds)


def shown(value, sign="", full=3):
    """An interval() as text: '29.12 [28.40, 29.85]' (sign "+": a difference, '+2.10 [+1.05, +3.02]'), its seeds
    said where fewer than full, or a dash."""
    if value is None:
        return "-"
    fewer = f" ({seeds(value[3])})" if value[3] < full else ""
    return "{0:{3}.2f} [{1:{3}.2f}, {2:{3}.2f}]".format(*value[:3], sign) + fewer


def seeds(n):
    return f"{n} seed" + "s" * (n != 1)


def shown_gain(value, full=3):
    return shown(value, "+", full)


def copying(cells, name, task):
    """(mean, std) over seeds of the share of a system's decoded words found in their source, and the
    references' share: the test cells' decode.copied. None where no cell has it."""
    rows = [c["decode"]["copied"] for c in runs(cells, name, task).values() if "copied" in c["decode"]]
    if not rows:
        return None
    outputs = [r["outputs"] for r in rows]
    std = statistics.stdev(outputs) if len(outputs) > 1 else 0.0
    return statistics.mean(outputs), std, statistics.mean(r["references"] for r in rows)


# --- the pages: the front page, the full tables, the samples, the superseded cells -----------------------

TITLE = "What pre-training adds to four objectives, at one small budget"


def setup_lines(cells, cfg, tasks, superseded):
    """The study's setup in a few lines: model, compute and FLOPs, data and splits, how choices were made."""
    import model as M
    shape = M.PRESETS[cfg["preset"]]
    flops, where = pretrain_flops(cells), ""
    if not flops and superseded:
        flops = pretrain_flops(superseded[SUPERSEDED["ft-lr-1e-3.jsonl"]])
        where = " (measured in the superseded cells, whose pre-trainings had these settings)"
    # the shared corpus's training split, 1.64M tokens (bench/RESULTS.md, the study)
    corpus = "" if cfg["preset"] == "tiny" else " of the shared corpus (1.64M training tokens, read about 24 times)"
    g = cfg["grid"]
    knobs = "; ".join(f"{o} {knob} {'/'.join(num(paper[t]) for t in tasks) if isinstance(paper, dict) else num(paper)}"
                      f" ({why})" + (f" or {num(lower)}" if g["target"] > 1 else "")
                      for o, (knob, paper, lower, why) in TARGET.items())
    lines = [f"- **Model**: the `{cfg['preset']}` preset ({shape['n_layer']} layers x {shape['n_embd']}, "
             f"{shape['n_head']} heads), a {cfg['vocab']:,}-piece WordPiece vocabulary. Every system pre-trains on "
             f"the same {cfg['corpus_tokens'] / 1e6:g}M corpus tokens (the text an objective reads, not the query rows "
             f"it adds){corpus}, in batches of {cfg['batch']} texts of {cfg['seq_len']} tokens, peak lr "
             f"{num(cfg['lr'])}.",
             f"- **FLOPs** of pre-training (model.estimate_flops){where}: "
             + (", ".join(f"{o} {flops[o]:.2e}" for o in OBJECTIVES if o in flops) or "not measured yet")
             + f". Fine-tuning: {cfg['ft_steps']:,} steps of {cfg['ft_batch']} pairs. Decoding: beam 5, trigram "
               "blocking, at most 32 tokens.",
             "- **Data**: each task's training pairs lose a dev split, on which every choice is made; the test "
             "split is scored once, by the finals, and no choice reads it.", "",
             "| task | training pairs | dev (choices) | selection fine-tunes on | test (reported) | metric |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {TASKS[t]['title']} | {SPLIT_TEXT[t]} | {NAMES[TASKS[t]['main']]} |" for t in tasks] + [""]
    if "squad_qg" in tasks:
        lines += ["  SQuAD QG here is not Du et al.'s test split: it is 90% of their *dev* file (the data this "
                  "project has) for training and its last tenth held out as the test split, so its numbers are not "
                  "comparable with published SQuAD QG results."]
    lines += [f"- **Choices**: each objective and each control is fine-tuned (seed 0) with every configuration of one "
              f"grid, the same for all: peak lr {' or '.join(num(x) for x in g['lr'])} x the objective's own "
              f"corruption of the target ({knobs}) x dropout {' or '.join(num(x) for x in g['dropout'])}, each "
              f"decoded on dev at length penalty {', '.join(num(x) for x in g['lp'])}: **"
              f"{len(g['lr']) * g['target'] * len(g['dropout']) * len(g['lp'])} configurations each**, the highest "
              "dev score chosen. The ablations and diagnostics take their parent's choice. The finals fine-tune on "
              f"every training pair with the choice, {seeds(cfg['seeds'])} (of pre-training and fine-tuning), decoded "
              "once on test.",
              "- **Intervals** (95%): a percentile bootstrap of 2,000 draws, each drawing the test pairs and the "
              "seeds with replacement, the same draw for a system and its control (or parent): an interval holds the "
              "pairs' luck and the seeds' together."]
    return lines


SPLIT_TEXT = {
    "gigaword": "10,000 (the first 10k of the standard training split) | the last 1,000 training pairs | the first "
                "9,000 | the 1,000 validation pairs",
    "squad_qg": "9,513: the first 90% of the lines of Du et al.'s dev file (10,570 lines, a question a line, "
                "sentence by sentence, paragraph by paragraph) | the tenth before the test split: lines 8,457-9,513, "
                "1,057 pairs on 703 source sentences | the first 8,456 | the last tenth: lines 9,514-10,570, 1,057 "
                "pairs on 799 source sentences (each cut falls between two source sentences, so every question on "
                "a sentence is on one side; the lines run paragraph by paragraph, so only the paragraph at a cut "
                "can be split)",
    "docsum": "the embedded task's training split | its validation split | the training split | its test split "
              "(the first 8 pairs of each scored)",
}


def pretrain_flops(cells):
    """{system: mean pre-training FLOPs} over these cells' pre-trainings."""
    found = {}
    for (name, _), record in pretrainings(cells).items():
        found.setdefault(name, []).append(record["flops"])
    return {n: statistics.mean(v) for n, v in found.items()}


def status_lines(cells, cfg, tasks, names, superseded, source):
    """What has run: this protocol's cells, the superseded ones, the estimate while the protocol is incomplete."""
    dev_wanted, finals_wanted = grid_cells(names, tasks, cfg), wanted_cells(names, tasks, cfg["seeds"])
    dev, finals = (sum(cell_stem(*c) in cells for c in wanted) for wanted in (dev_wanted, finals_wanted))
    dev_all, finals_all = len(dev_wanted), len(finals_wanted)
    lines = [f"Cells of this protocol in `{source}`: {dev} of {dev_all} dev cells, {finals} of {finals_all} finals."]
    if finals == 0:
        lines[0] += (" **No number on this page is a test result yet: the protocol has not run.** The tables "
                     "below fill in as its cells are imported.")
    elif finals < finals_all:
        lines[0] += " A system without its finals shows a dash."
    if superseded and finals < finals_all:
        sizes = ", ".join(f"{len(c)} cells at {label}" for label, c in superseded.items())
        lines += ["", f"The cells that exist besides are the earlier studies' ({sizes}; `bench/study/superseded/`), "
                  "made under another protocol: every fine-tuning choice in them (learning rate, target noise, "
                  "length penalty, dropout) was made on the same pairs they were scored on (Gigaword's 1,000 "
                  "validation pairs, SQuAD QG's last tenth: this protocol's test split), and they have no dev split. "
                  "Their numbers are not test results; they are kept as data, with their own page "
                  "(`superseded/README.md`)."]
    missing = [c for c in dev_wanted + finals_wanted if cell_stem(*c) not in cells]
    jobs = plan(missing, argparse.Namespace(out="/nonexistent"))
    measured = {**(superseded or {}).get(SUPERSEDED["ft-lr-1e-3.jsonl"], {}), **cells}
    minutes = estimate(jobs, measured, cfg) if missing and cfg["preset"] != "tiny" else None
    if minutes is not None:
        lines += ["", f"The protocol left: {len(jobs)} jobs, about {minutes:.0f} process-minutes, so about "
                  f"{minutes / AT_ONCE:.0f} minutes of a 4-GPU machine (`--gpus 4 --per_gpu 4 --mps`): an estimate "
                  "from the per-job process-minutes measured in the cells (`python bench/study.py plan`), not yet "
                  "measured."]
    return lines


def answer_lines(cells, tasks, cfg):
    """The one table (each objective, its control, the gain with its interval, on every task) and the answer."""
    lines = ["| objective | " + " | ".join(f"{TASKS[t]['title']} {NAMES[TASKS[t]['main']]}: pre-trained | control | "
                                          "gain" for t in tasks) + " |", "|---" * (1 + 3 * len(tasks)) + "|"]
    full = cfg["seeds"]
    for o in OBJECTIVES:
        control = f"{o}/no pre-training"
        lines.append(f"| {o} | " + " | ".join(
            f"{shown(interval(cells, o, t), full=full)} | {shown(interval(cells, control, t), full=full)} | "
            f"{shown_gain(interval(cells, o, t, control), full)}" for t in tasks) + " |")
    lines += ["", f"Each entry: the mean over {seeds(cfg['seeds'])} of the test score (fewer where said) and its 95% "
              "interval over test "
              "pairs and seeds; the gain is the pre-trained system minus its control, seed by seed on the same pairs.",
              ""]
    return lines + [" ".join(answer(cells, t) for t in tasks if answer(cells, t))
                    or "Not measured yet: no objective has its finals."]


def answer(cells, task):
    """The answer on a task in a sentence or two, from the intervals: which objectives pre-training adds to, which
    scores highest and which overlap it; '' where no objective has its finals."""
    scores = {o: interval(cells, o, task) for o in OBJECTIVES}
    scores = {o: value for o, value in scores.items() if value}
    if not scores:
        return ""
    gains = {o: interval(cells, o, task, f"{o}/no pre-training") for o in scores}
    gains = {o: g for o, g in gains.items() if g}
    groups = [([o for o, g in gains.items() if g[1] > 0], "pre-training adds to {} (the gain's interval above zero)"),
              ([o for o, g in gains.items() if g[2] < 0], "{} scores below its control"),
              ([o for o, g in gains.items() if g[1] <= 0 <= g[2]], "for {} the gain's interval includes zero")]
    parts = [text.format(words(names)) for names, text in groups if names]
    best = max(scores, key=lambda o: scores[o][0])
    tied = [o for o in scores if o != best and scores[o][2] >= scores[best][1]]
    others = [o for o in scores if o != best]
    ranking = (f"{best} scores highest, {shown(scores[best])}" + (
        f"; the interval of {words(tied)} overlaps it" if tied else
        f", above the interval of {words(others)}" if others else " (the only objective with finals)"))
    return f"On {TASKS[task]['title']}, " + "; ".join(parts + [ranking]) + "."


def words(names):
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def ablation_lines(cells, tasks):
    """The ablations, each at its parent's choice: its test score and its difference from the parent."""
    lines = ["| ablation | of | " + " | ".join(f"{TASKS[t]['title']} {NAMES[TASKS[t]['main']]} | difference"
                                                for t in tasks) + " |", "|---|---" + "|---|---" * len(tasks) + "|"]
    for name in ABLATIONS:
        parent = SYSTEMS[name]["ablation_of"]
        row = [f"{shown(interval(cells, name, t))} | {shown_gain(interval(cells, name, t, parent))}" for t in tasks]
        lines.append(f"| {name} | {parent} | " + " | ".join(row) + " |")
    return lines


ABLATIONS = ("unilm/no seq2seq LM", "pmlm/AE only", "ernie_gen/no span flow", "ernie_gen/no noise", "palm/no copy",
             "palm/no copy/no pre-training")
SWAPS = {"ernie_gen": "ERNIE-GEN", "pmlm": "UniLMv2 (pmlm)",
         "ernie_gen/ft from pmlm": "ERNIE-GEN's fine-tuning and decoding on pmlm's pre-trained weights (1 seed)",
         "pmlm/ft from ernie_gen": "pmlm's fine-tuning and decoding on ERNIE-GEN's pre-trained weights (1 seed)",
         "ernie_gen/relative bias": "ERNIE-GEN pre-trained with pmlm's relative position bias"}
COPIERS = ("palm", "palm/no pre-training", "palm/no copy", "palm/no copy/no pre-training", "pmlm", "ernie_gen")


def gap_lines(cells, tasks):
    """Where ERNIE-GEN's gap to pmlm is: the swaps of pre-trained weights and fine-tuning, the relative bias."""
    lines = ["| system | what it holds | " + " | ".join(f"{TASKS[t]['title']} {NAMES[TASKS[t]['main']]}"
                                                     for t in tasks) + " |", "|---|---" + "|---" * len(tasks) + "|"]
    for name, what in SWAPS.items():
        lines.append(f"| {name} | {what} | " + " | ".join(shown(interval(cells, name, t)) for t in tasks) + " |")
    return lines + ["", "If ERNIE-GEN's fine-tuning on pmlm's weights lands near pmlm, and pmlm's on ERNIE-GEN's near "
                    "ERNIE-GEN, the pre-trained weights carry the gap; the relative bias tells the objective from that "
                    "bias."]


def copy_lines(cells, tasks):
    """What PALM's copy head and its pre-training do to copying: the share of output words found in the source."""
    lines = ["| system | " + " | ".join(f"{TASKS[t]['title']}: output words found in the source | "
                                       f"{NAMES[TASKS[t]['main']]}" for t in tasks) + " |",
             "|---" + "|---|---" * len(tasks) + "|"]
    for name in COPIERS:
        row = []
        for t in tasks:
            c = copying(cells, name, t)
            row += [f"{c[0]:.1f}% (references {c[2]:.1f}%)" if c else "-", shown(interval(cells, name, t))]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    gains = [f"{TASKS[t]['title']} {shown_gain(interval(cells, 'palm', t, 'palm/no pre-training'))} with it, "
             f"{shown_gain(interval(cells, 'palm/no copy', t, 'palm/no copy/no pre-training'))} without"
             for t in tasks]
    return lines + ["", "What PALM's pre-training adds with its copy head and without it: " + "; ".join(gains) + "."]


def front_page(cells, cfg, tasks, names, superseded, source):
    """bench/study/README.md: the question, the setup, the one answer table, the ablations and diagnostics, links."""
    lines = [f"# {TITLE}", "",
             f"Generated by `python bench/study.py report` from `{source}`; do not edit by hand.", "",
             "## The question", "",
             "Four pre-training objectives (UniLM, UniLMv2's pmlm, ERNIE-GEN, PALM) on one backbone, each pre-trained "
             "on the same number of corpus tokens: how much does each add over the same fine-tuning from random "
             "weights (its control), on headline generation (Gigaword 10k) and question generation (SQuAD QG)?", "",
             "## Setup", ""]
    lines += setup_lines(cells, cfg, tasks, superseded) + ["", "## What has run", ""]
    lines += status_lines(cells, cfg, tasks, names, superseded, source) + ["", "## The answer", ""]
    lines += answer_lines(cells, tasks, cfg) + [
        "", "## The ablations", "", f"The papers' ablations that are cheap here, each fine-tuned with its parent's "
        f"choice, {seeds(cfg['seeds'])}, on test; the difference is the ablation minus its parent, seed by seed on "
        "the same pairs.", ""]
    lines += ablation_lines(cells, tasks) + ["", "## ERNIE-GEN and PALM", "", "### Where ERNIE-GEN's gap is", ""]
    lines += gap_lines(cells, tasks) + ["", "### What PALM's copy head and its pre-training do to copying", ""]
    lines += copy_lines(cells, tasks)
    lines += ["", "## More", "",
              "- [tables.md](tables.md): every system's scores on test (with teacher-forced accuracy, output lengths, "
              "wall times, FLOPs), the dev grid and each choice.",
              "- [samples.md](samples.md): sample outputs.",
              "- [superseded/README.md](superseded/README.md): the earlier studies' cells, chosen on the pairs they "
              "were scored on.",
              "- How the study runs: `bench/study.py`'s docstring; what it measured, topic by topic: "
              "`bench/RESULTS.md`, \"The study\"; the pictures: `notebooks/07_study.ipynb`."]
    return "\n".join(lines) + "\n"


def tables_page(cells, cfg, tasks, names, source):
    """bench/study/tables.md: the choices, the dev grid, every system's test scores."""
    lines = ["# The study's tables: the choices, the dev grid, the test scores", "",
             f"Generated by `python bench/study.py report` from `{source}`; the study's question and answer: "
             "[README.md](README.md).", ""]
    scored_ = [c for c in cells.values() if "card" in c]
    if scored_:
        cards = sorted({f"{c['card']} (torch {c['torch']})" for c in scored_})
        lines += [f"Settings: `{json.dumps(settings_key(cfg))}`. Ran on: {', '.join(cards)}. {layout(cells)}", ""]
    failed = [c for c in cells.values() if c.get("diverged")]
    if failed:
        lines += ["Fine-tunings that diverged on both attentions (no scores; a choice skips them, a mean is over the "
                  "other seeds): " + "; ".join(f"{stem_of(c)}" for c in failed) + ".", ""]
    owners = list(dict.fromkeys(tuned(n) for n in names))
    lines += ["## The choices", ""] + choice_lines(cells, cfg, tasks, owners)
    for t in tasks:
        lps = cfg["grid"]["lp"]
        lines += ["", f"## The dev grid, {TASKS[t]['title']} ({NAMES[TASKS[t]['main']]} on dev, seed 0; words an "
                  "output in brackets)", "", "| system | configuration | " + " | ".join(f"lp {x:g}" for x in lps)
                  + " |", "|---|---" + "|---" * len(lps) + "|"]
        for name in owners:
            for config, _ in grid(name, t, cfg):
                cell = cells.get(cell_stem(name, t, 0, config))
                got = (cell or {}).get("by_lp", {})
                main = TASKS[t]["main"]
                row = [f"{got[f'{x:g}'][main]:.2f} ({got[f'{x:g}']['words']:.1f})" if f"{x:g}" in got else
                       ("diverged" if cell else "-") for x in lps]
                lines.append(f"| {name} | {config} | " + " | ".join(row) + " |")
    for t in tasks:
        lines += [""] + scores_table(cells, t, names)
    return "\n".join(lines) + "\n"


def choice_lines(cells, cfg, tasks, names):
    """A table of each system's choice on each task: among how many configurations, which, its dev score."""
    lines = ["| system | task | chosen among | configuration | length penalty | dev score |",
             "|---|---|---|---|---|---|"]
    for name in names:
        for t in tasks:
            c = choose(cells, name, t, cfg)
            dev = "-" if c is None or c["dev"] is None else f"{c['dev']:.2f} {NAMES[TASKS[t]['main']]}"
            lines.append(f"| {name} | {t} | {configurations(name, t, cfg)} | "
                         + (f"{c['config']} | {c['lp']:g} | {dev} |" if c else "not chosen yet | | |"))
    return lines


def scores_table(cells, task, names):
    """Every system's test scores on a task: mean ± std over seeds, the interval over pairs and seeds, teacher-forced
    accuracy, wall time and FLOPs, words from the source, output lengths."""
    metrics_ = TASKS[task]["metrics"]
    main = TASKS[task]["main"]
    lines = [f"## Test, {TASKS[task]['title']}", "",
             "| system | seeds | " + " | ".join(NAMES[m] for m in metrics_)
             + f" | {NAMES[main]}: 95% interval | teacher-forced acc | wall: pre-train + fine-tune + decode (min) | "
               "FLOPs: pre-train + fine-tune | words from the source | words an output |",
             "|---" * (len(metrics_) + 8) + "|"]
    for name in names:
        rows = list(runs(cells, name, task).values())
        if not rows:
            lines.append(f"| {name} | not run yet |" + " |" * (len(metrics_) + 6))
            continue
        values = [summary(cells, name, task, m) for m in metrics_]
        pre = [c["pretrain"] or {} for c in rows]
        minutes = [statistics.mean(p.get("seconds", 0) for p in pre) / 60,
                   statistics.mean(c["finetune"]["seconds"] for c in rows) / 60,
                   statistics.mean(c["decode"]["seconds"] for c in rows) / 60]
        flops = (statistics.mean(p.get("flops", 0) for p in pre),
                 statistics.mean(c["finetune"]["flops"] for c in rows))
        copied = copying(cells, name, task)
        w = [statistics.mean(c["decode"]["words"][k] for c in rows) for k in ("outputs", "references")]
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(f"{m:.2f} ± {s:.2f}" for m, s, _ in values)
                     + f" | {shown(interval(cells, name, task))} | "
                       f"{statistics.mean(c['teacher_forced_acc'] for c in rows):.1f}% | "
                     + " + ".join(f"{m:.1f}" for m in minutes) + f" | {flops[0]:.2e} + {flops[1]:.2e} | "
                       f"{copied[0]:.1f}% ({copied[2]:.1f}%) | {w[0]:.1f} ({w[1]:.1f}) |")
    return lines + ["", "Words from the source and words an output: the references' in brackets."]


def layout(cells):
    """How the cells' batches were laid out (--pack, --ft_pack: the same numbers, other speeds) and which
    attention the fine-tunings finished on."""
    said_ = [f"{what} {sum(r.get('packed', False) for r in records)} of {len(records)} packed"
             for what, records in (("pre-trainings", list(pretrainings(cells).values())),
                                   ("fine-tunings", [c.get("finetune", {}) for c in cells.values()]))]
    naive = sum(c.get("finetune", {}).get("attn") == "naive" for c in cells.values())
    return ("Batches (study.py --pack, --ft_pack; the others one passage a row): " + ", ".join(said_) + "."
            + (f" Fine-tunings finished on the written-out attention: {naive} of {len(cells)}." if naive else ""))


def samples_page(cells, tasks, names, source):
    """bench/study/samples.md: each system's outputs for the first three test sources (seed 0)."""
    lines = ["# The study's sample outputs", "",
             f"Generated by `python bench/study.py report` from `{source}`: each system's outputs (seed 0) for the "
             "first three sources of the test split. The study: [README.md](README.md).", ""]
    for task in tasks:
        shown_ = [(n, runs(cells, n, task)[0]) for n in names if 0 in runs(cells, n, task)]
        lines += [f"## {TASKS[task]['title']}", ""] + ([] if shown_ else ["No final has run yet.", ""])
        for name, cell in shown_:
            lines += [f"**{name}**", ""] + [f"- source: {e['source'][:200]}<br>reference: {e['reference']}<br>"
                                            f"output: {e['output']}" for e in cell["examples"]] + [""]
    return "\n".join(lines) + "\n"


def superseded_page(superseded):
    """bench/study/superseded/README.md: the earlier studies' cells, whose choices were made on their scored pairs."""
    lines = ["# Superseded study cells: chosen on the pairs they were scored on", "",
             "Generated by `python bench/study.py report`. These cells come from the earlier studies, run before the "
             "study had a dev split: they were fine-tuned on all training pairs and scored on Gigaword's 1,000 "
             "validation pairs and SQuAD QG's last tenth (the study's test split now), and every fine-tuning choice "
             "(learning rate, the recipe search's target noise, length penalty, dropout, 24 pmlm recipes) was "
             "made on those same pairs. So their numbers are favoured by that search and are **not test results**; "
             "the study's own page ([../README.md](../README.md)) reports none of them. A value is the mean ± std "
             "over seeds. What they taught is summed up in `bench/RESULTS.md`, \"The study\"; `variants.jsonl` holds "
             "one-off experiments (its `variant` field names each).", ""]
    for label, cells in superseded.items():
        lines += [f"## {label}", ""]
        for task in ("gigaword", "squad_qg"):
            metrics_ = TASKS[task]["metrics"]
            lines += [f"**{TASKS[task]['title']}**", "", "| system | seeds | " + " | ".join(NAMES[m] for m in metrics_)
                      + " |", "|---|---" + "|---" * len(metrics_) + "|"]
            ran = {c["system"] for c in cells.values() if c["task"] == task}
            for name in [n for n in SYSTEMS if n in ran] + sorted(ran - set(SYSTEMS)):
                values = [summary(cells, name, task, m) for m in metrics_]
                if values[0]:
                    lines.append(f"| {name} | {values[0][2]} | "
                                 + " | ".join(f"{m:.2f} ± {s:.2f}" for m, s, _ in values) + " |")
            lines.append("")
    return "\n".join(lines)


# --- the pictures (notebooks/07_study.ipynb draws them) ---------------------------------------------

def color(name):
    return COLORS[SYSTEMS[name]["objective"]] if name in SYSTEMS else "grey"


def plot_answer(ax, cells, task):
    """Each objective's test score (solid) beside its control's (hatched), with their 95% intervals over pairs and
    seeds, and the gain with its interval written above; an objective without finals is named so."""
    metric = TASKS[task]["main"]
    for i, name in enumerate(OBJECTIVES):
        pair = (name, f"{name}/no pre-training")
        got = [interval(cells, n, task) for n in pair]
        for offset, value, hatch in zip((-0.2, 0.2), got, (None, "//")):
            if value:
                ax.bar(i + offset, value[0], 0.38, yerr=[[value[0] - value[1]], [value[2] - value[0]]], capsize=3,
                       color=COLORS[name], hatch=hatch, edgecolor="black", alpha=0.9 if hatch is None else 0.5)
        gain = interval(cells, name, task, pair[1])
        top = max([v[2] for v in got if v] + [0])
        ax.text(i, top, "not run" if gain is None else f"{gain[0]:+.1f}\n[{gain[1]:+.1f}, {gain[2]:+.1f}]",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(OBJECTIVES)), OBJECTIVES, fontsize=8)
    ax.set_ylabel(f"{NAMES[metric]} on test (95% interval)")
    ax.set_title(f"{TASKS[task]['title']}: pre-trained (solid) vs control (hatched); the gain above", fontsize=9)
    ax.margins(y=0.2)


def plot_differences(ax, cells, task, pairs, title):
    """Each (base, name) pair's difference name - base on test, a point with its 95% interval; zero dotted."""
    rows = [(f"{name}\n(vs {base})", interval(cells, name, task, base), color(name)) for base, name in pairs]
    for i, (_, value, colour) in enumerate(rows):
        if value:
            ax.errorbar(value[0], i, xerr=[[value[0] - value[1]], [value[2] - value[0]]], fmt="o", color=colour,
                        capsize=3)
        else:
            ax.text(0, i, "not run", va="center", fontsize=7)
    ax.axvline(0, color="grey", linestyle=":")
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"difference in {NAMES[TASKS[task]['main']]} on test (95% interval)")
    ax.set_title(title, fontsize=9)


def plot_bars(ax, cells, task, title):
    """Each objective (solid) beside its control (hatched), the mean over seeds with a std error bar: for cells
    without pair statistics (the superseded ones), whose intervals hold the seeds only."""
    metric = TASKS[task]["main"]
    for i, name in enumerate(OBJECTIVES):
        for offset, system_, hatch in ((-0.2, name, None), (0.2, f"{name}/no pre-training", "//")):
            s = summary(cells, system_, task, metric)
            if s:
                ax.bar(i + offset, s[0], 0.38, yerr=s[1], capsize=3, color=COLORS[name], hatch=hatch,
                       edgecolor="black", alpha=0.9 if hatch is None else 0.5)
                ax.text(i + offset, s[0] + s[1], f"{s[0]:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(OBJECTIVES)), OBJECTIVES, fontsize=8)
    ax.set_ylabel(f"{NAMES[metric]} (mean, std over seeds)")
    ax.set_title(title, fontsize=9)


def plot_copying(ax, cells, task, names):
    """How much of what each system writes comes from its source: the share of its output words found in the
    source (mean over seeds, std bar; controls hatched), the references' share dashed, the task's score over each
    bar."""
    metric = TASKS[task]["main"]
    refs = []
    for i, name in enumerate(names):
        copied = copying(cells, name, task)
        if copied is None:
            ax.text(i, 0, "not\nrun", ha="center", va="bottom", fontsize=7)
            continue
        mean, std, references = copied
        refs.append(references)
        hatch = "//" if SYSTEMS[name]["control"] else None
        ax.bar(i, mean, 0.6, yerr=std, capsize=3, color=color(name), hatch=hatch, edgecolor="black",
               alpha=0.9 if hatch is None else 0.5)
        ax.text(i, mean + std, f"{mean:.0f}%\n{NAMES[metric]} {summary(cells, name, task, metric)[0]:.1f}",
                ha="center", va="bottom", fontsize=7)
    if refs:
        ax.axhline(statistics.mean(refs), color="black", linestyle="--", linewidth=1,
                   label=f"references: {statistics.mean(refs):.0f}%")
        ax.legend(fontsize=7, loc="upper right")
    ax.set_ylim(0, 100)
    ax.set_xticks(range(len(names)), [n.replace("/", "\n", 1) for n in names], fontsize=7)
    ax.set_ylabel("output words found in the source (%)")
    ax.set_title(TASKS[task]["title"], fontsize=9)


# --- the time it takes -------------------------------------------------------------------------------------

def estimate(jobs, cells, cfg):
    """Process-minutes of these jobs, from the measured cells: a pre-training its system's mean wall time (else
    every pre-training's mean), a fine-tuning its objective's mean on the task, its decoding a measured decoding's
    time for each length penalty it decodes at (a dev cell at every one). None where nothing was measured."""
    pre = pretrain_seconds(cells)
    fine, decode = {}, {}
    for c in cells.values():
        if not c.get("diverged") and "decode" in c:
            fine.setdefault((c["objective"], c["task"]), []).append(c["finetune"]["seconds"])
            lps = len(c.get("by_lp", [None]))
            decode.setdefault((c["objective"], c["task"]), []).append(c["decode"]["seconds"] / lps)
    if not pre or not fine:
        return None
    fine = {k: statistics.mean(v) for k, v in fine.items()}
    decode = {k: statistics.mean(v) for k, v in decode.items()}
    seconds = 0.0
    for job in jobs:
        if job[0] == "pre":
            seconds += pre.get(job[1], statistics.mean(pre.values()))
            continue
        key = (SYSTEMS[job[1]]["objective"], job[2])
        lps = len(cfg["grid"]["lp"]) if len(job) == 5 else 1
        seconds += fine.get(key, statistics.mean(fine.values()))
        seconds += lps * decode.get(key, statistics.mean(decode.values()))
    return seconds / 60


# --- the command line ------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("command", nargs="?", default="run", choices=("run", "import", "report", "plan", "job"),
                    help="run (default): the missing cells; import FILE: a .jsonl of cells merged into --cells; "
                         "report: the pages of --cells; plan: the jobs left and their estimated time")
    ap.add_argument("file", nargs="?", default="", help="import: the cells file; job: internal")
    ap.add_argument("--out", default="out/study", help="work folder (checkpoints, logs, caches, split files)")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (0: the CPU)")
    ap.add_argument("--per_gpu", type=int, default=1, help="jobs at once on each GPU (or the CPU)")
    ap.add_argument("--time_limit_min", type=float, default=0.0,
                    help="after this many minutes no job starts and those in flight stop; 0 = none")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the finals")
    ap.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--cells", default=None,
                    help="the finished cells, a .jsonl file (default bench/study/cells.jsonl; --tiny: none)")
    ap.add_argument("--cells_out", default="",
                    help="where new cells go, a .jsonl file (default OUT/cells.jsonl)")
    ap.add_argument("--pages", default=str(HERE), help="report: the folder of the pages")
    ap.add_argument("--only", default="", help="comma-separated systems (any subset of SYSTEMS; the choices "
                                               "they need come along)")
    ap.add_argument("--tasks", default="gigaword,squad_qg", help="comma-separated tasks of this run")
    ap.add_argument("--compile", default="auto", choices=("auto", "true", "false"),
                    help="train.py's --compile for the pre-trainings")
    ap.add_argument("--ft_compile", default="false", choices=("auto", "true", "false"),
                    help="train.py's --compile for the fine-tunings (eager ran faster: bench/RESULTS.md, the study)")
    ap.add_argument("--workers", type=int, default=-1, help="train.py's --workers for every job")
    ap.add_argument("--pack", default="auto", choices=("auto", "true", "false"),
                    help="train.py's --pack for the pre-trainings (the same per-token losses, 3.4x the steps/s)")
    ap.add_argument("--ft_pack", default="false", choices=("auto", "true", "false"),
                    help="train.py's --pack for the fine-tunings (eager and host-bound, they ran slower packed)")
    ap.add_argument("--ft_attn", default="sdpa", choices=("sdpa", "naive"),
                    help="train.py's --attn_impl for the fine-tunings (a layout, not a setting); a fine-tuning "
                         "whose loss goes non-finite on sdpa runs again on naive")
    ap.add_argument("--cache_dir", default="",
                    help="vocabulary and tokenized data, shared by the jobs (default OUT/cache)")
    ap.add_argument("--mps", action="store_true", help="run the jobs under CUDA's multi-process service, so the "
                                                       "jobs on a GPU run their kernels side by side")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--stop_after_cells", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or set(tasks) - {"gigaword", "squad_qg"}:
        raise UsageError(f"--tasks {args.tasks!r}: choose gigaword, squad_qg or both (comma-separated)")
    args.tasks = [t for t in ("gigaword", "squad_qg") if t in tasks]
    if args.tiny:
        args.seeds = 1
    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if args.cells is None:
        args.cells = "" if args.tiny else str(CELLS)
    args.cells_out = args.cells_out or str(Path(args.out) / "cells.jsonl")
    for flag, path in (("--cells", args.cells), ("--cells_out", args.cells_out)):
        if path and not path.endswith(".jsonl"):
            raise UsageError(f"{flag} {path}: cells are a .jsonl file (one cell a line)")
    args.cache_dir = args.cache_dir or str(Path(args.out) / "cache")
    if args.per_gpu < 1 or args.gpus < 0:
        raise UsageError("--per_gpu must be >= 1 and --gpus >= 0")
    if args.mps and not args.gpus:
        raise UsageError("--mps shares GPUs between jobs: it needs --gpus 1 or more")
    if args.mps and not shutil.which(MPS_CONTROL):
        raise UsageError(f"--mps: no {MPS_CONTROL} on the PATH (it comes with NVIDIA's driver)")
    return args


def stores(args):
    return [args.cells, Path(args.out) / "cells.jsonl", args.cells_out]


def todo_cells(args, cfg, names, cells):
    """(wanted, missing): every cell of the protocol for these systems (dev cells first), those not done."""
    wanted = grid_cells(names, cfg["tasks"], cfg) + wanted_cells(names, cfg["tasks"], cfg["seeds"])
    return wanted, [c for c in wanted if cell_stem(*c) not in cells]


def run(args):
    cfg = settings(args)
    names = systems_of(args)
    if not args.tiny and not Path(args.data_dir, "gigaword10k").is_dir():
        raise UsageError(f"--data_dir {args.data_dir}: no gigaword10k/ there (see the docstring)")
    if args.gpus:
        import torch
        if torch.cuda.device_count() < args.gpus:
            raise UsageError(f"--gpus {args.gpus}: only {torch.cuda.device_count()} GPU(s) here")
    cells = done_cells(stores(args), cfg)
    wanted, todo = todo_cells(args, cfg, names, cells)
    print(f"{len(wanted) - len(todo)} cells done, {len(todo)} to run", flush=True)
    t0 = time.time()
    measured = {**superseded_cells()[SUPERSEDED["ft-lr-1e-3.jsonl"]], **cells}
    jobs = plan(todo, args, pretrain_seconds(measured))
    if jobs:
        prepare(cfg, args, ernie=any(SYSTEMS[j[1]]["objective"] == "ernie_gen" for j in jobs),
                progress=not args.tiny)
    with multi_process_service(args) as env:
        args.job_env = env
        new = schedule(jobs, args, args.cells_out, cells, cfg)
    print(f"{new} new cell(s) in {(time.time() - t0) / 60:.1f} min; in {args.cells_out}", flush=True)
    page = front_page(cells, cfg, cfg["tasks"], names, {} if args.tiny else superseded_cells(), args.cells_out)
    atomic_write(Path(args.out) / "README.md", page)
    print(page.split("## The ablations")[0].split("## What has run")[1])


def import_cells(args):
    """Merge a .jsonl of cells (from a GPU machine's $OUT) into --cells: a cell of the same stem is replaced;
    the file stays sorted by stem."""
    if not Path(args.file).is_file():
        raise UsageError(f"import: no file {args.file!r}")
    cells = read_cells(args.file)
    target = Path(args.cells or CELLS)
    before = read_cells(target)
    save_cells(target, {**before, **cells})
    fresh = sum(k not in before for k in cells)
    print(f"{len(cells)} cell(s) from {args.file}: {fresh} new, {len(cells) - fresh} replaced; "
          f"{len(before) + fresh} in {target}")


def write_report(args):
    """The pages of a cells file: the front page, the tables, the samples; and the superseded cells' page."""
    cfg = settings(args)
    cells = done_cells([args.cells or CELLS], cfg)
    names = systems_of(args)
    source = Path(args.cells or CELLS).resolve()
    source = source.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT) else str(source)
    superseded = {} if args.tiny else superseded_cells()
    pages = Path(args.pages)
    atomic_write(pages / "README.md", front_page(cells, cfg, cfg["tasks"], names, superseded, source))
    atomic_write(pages / "tables.md", tables_page(cells, cfg, cfg["tasks"], names, source))
    atomic_write(pages / "samples.md", samples_page(cells, cfg["tasks"], names, source))
    if superseded:
        atomic_write(pages / "superseded" / "README.md", superseded_page(superseded))
    print(f"{pages}: the pages of {len(cells)} cell(s) of {len({c['system'] for c in cells.values()})} systems")


def show_plan(args):
    """The jobs left of the protocol, by kind, and their time estimated from the measured cells."""
    cfg = settings(args)
    names = systems_of(args)
    cells = done_cells(stores(args), cfg)
    wanted, todo = todo_cells(args, cfg, names, cells)
    jobs = plan(todo, args)
    kinds = {"pre-trainings": sum(j[0] == "pre" for j in jobs), "dev cells": sum(len(j) == 5 for j in jobs),
             "finals": sum(len(j) == 4 for j in jobs)}
    print(f"{len(wanted) - len(todo)} of {len(wanted)} cells done; left: "
          + ", ".join(f"{n} {k}" for k, n in kinds.items()))
    minutes = estimate(jobs, {**superseded_cells()[SUPERSEDED["ft-lr-1e-3.jsonl"]], **cells}, cfg)
    if minutes is None:
        raise UsageError("no measured cells to estimate the time from")
    print(f"about {minutes:.0f} process-minutes: about {minutes / AT_ONCE:.0f} minutes of a 4-GPU machine at "
          f"{AT_ONCE} jobs at once (--gpus 4 --per_gpu 4 --mps), estimated from the measured cells")


def watch_scheduler():
    """A job whose scheduler is gone (killed without a chance to stop it) stops itself as the
    scheduler would have: SIGTERM (train.py checkpoints), then exit. Never a GPU held by an orphan."""
    import threading
    scheduler = int(os.environ.get("STUDY_SCHEDULER", os.getppid()))

    def watch():
        while os.getppid() == scheduler:
            time.sleep(2)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "job":
        # internal: one job of the scheduler, in its own process
        watch_scheduler()
        payload = json.loads(args.file)
        if isinstance(payload, list):
            run_pretraining(payload[1], payload[2], settings(args), args)
        else:
            run_cell(payload, settings(args), args)
    elif args.command == "import":
        import_cells(args)
    elif args.command == "report":
        write_report(args)
    elif args.command == "plan":
        show_plan(args)
    else:
        run(args)


if __name__ == "__main__":
    try:
        main()
    except UsageError as e:
        exit_with_error(PROG, e)

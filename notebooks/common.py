"""What the notebooks share: the project on the import path, the checkpoints they read, one heatmap.

    import common                                   # first cell of every notebook (run from notebooks/)
    path = common.tiny_checkpoint("pmlm")           # the README's main job, out/pmlm-pretrain/ckpt.pt
    path = common.tiny_checkpoint("palm", "lead")   # PALM fine-tuned on the lead-sentence task
    path = common.tiny_checkpoint("ernie_gen", "lead-short")   # ERNIE-GEN on its short-source variant
    common.heatmap(ax, mask, rows, cols)            # a boolean or float matrix with readable token labels
    python notebooks/common.py                      # build every checkpoint the notebooks read, once

Every checkpoint is made by train.py itself, run as a command (nothing re-implemented here). Pre-training
is the README's main job (`python train.py --objective pmlm`, out/pmlm-pretrain/): one UniLMv2 checkpoint
serves every notebook, and each objective fine-tunes it with its own recipe, as train.py allows. The
fine-tuned checkpoints live in .cache/notebooks/ at the repository root.

The notebooks' generation task is the LEAD-SENTENCE task: a docstring body (its first 64 words) -> its
first sentence. It is the embedded docsum task's sources with an easier target, which PALM's tiny model
learns in 300 fine-tuning steps (the real summaries it does not: README, "Fine-tune, generate, evaluate").
ERNIE-GEN's demo reads the same pairs with each source cut to its first 32 words ("lead-short": the target,
at most 20 words, still lies inside it), fine-tuned 1,000 steps without target noise: 04_ernie_gen.ipynb
says why. A notebook opened before its checkpoint exists says so in its first output, names this file's
command, and builds it.
Left out: any training recipe of its own (train.py's flags only), GPU-sized checkpoints.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import data  # noqa: E402  (after the path is set)

CACHE = ROOT / ".cache"
MAIN_JOB = ROOT / "out" / "pmlm-pretrain" / "ckpt.pt"
PREPARE = "python notebooks/common.py"
# the lead-sentence task: sources cut to this many words, first sentences of 3..20 words
LEAD_SRC_WORDS, LEAD_MIN_WORDS, LEAD_MAX_WORDS = 64, 3, 20
# source words of each task: "lead-short" is the same pairs, sources cut further (the target still fits)
TASK_SRC_WORDS = {"lead": LEAD_SRC_WORDS, "lead-short": 32}
# fine-tuning recipes, by (objective, task), batch 16: (optimizer steps, train.py flags beyond the task).
# PALM's model learns the lead task in 300 (05_palm.ipynb). ERNIE-GEN's [ATTN] decoder, without a copy
# head, needs clean histories to learn copying (rho_f 0) and shorter sources to learn it in 1,000 steps
# (04_ernie_gen.ipynb measures both)
FINETUNE = {("palm", "lead"): (300, []),
            ("ernie_gen", "lead-short"): (1000, ["--rho_f", "0"])}
QUIET = ["--progress", "false", "--log_interval", "100", "--eval_interval", "100000",
         "--eval_batches", "1", "--ckpt_interval", "100000"]


def main_vocab_size():
    """The main job's vocabulary size: the tiny preset's recipe in config.py (`python train.py --help` prints it)."""
    import config
    return config.RECIPES["tiny"]["vocab_size"]


def lead_pairs(task="lead", cache_dir=CACHE):
    """{split: [(source, first sentence)]}: docsum's sources, each with its own first sentence as target;
    task "lead-short" cuts each source to its first TASK_SRC_WORDS["lead-short"] words (the same pairs)."""
    if task not in TASK_SRC_WORDS:
        raise ValueError(f"task {task!r}: the lead tasks are {', '.join(TASK_SRC_WORDS)}")
    splits = {}
    for split, pairs in data.default_seq2seq(cache_dir).items():
        rows = []
        for source, _ in pairs:
            words = source.split()[:LEAD_SRC_WORDS]
            first = data.split_sentences(" ".join(words))[0]
            # a sentence cut by the 64-word budget has no end to find: skip it
            if LEAD_MIN_WORDS <= len(first.split()) <= LEAD_MAX_WORDS and first[-1] in ".!?":
                rows.append((" ".join(words[:TASK_SRC_WORDS[task]]), first))
        splits[split] = rows
    return splits


def lead_task_file(task="lead"):
    """A lead task as train.py reads it: .cache/notebooks/<task>/train.jsonl (+ valid, test)."""
    folder = CACHE / "notebooks" / task
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in lead_pairs(task).items():
        lines = "".join(json.dumps({"src": s, "tgt": t}) + "\n" for s, t in rows)
        path = folder / f"{split}.jsonl"
        if not path.exists() or path.read_text() != lines:
            path.write_text(lines)
    return folder / "train.jsonl"


def tiny_checkpoint(objective="pmlm", task="pretrain"):
    """Path of the main job's checkpoint (task "pretrain"), or of `objective` fine-tuned on a lead task
    with its recipe in FINETUNE.

    Built when missing, and rebuilt when it no longer fits the code or (fine-tuned) its recipe or the main job
    changed since, so that `python notebooks/execute.py --save` always refreshes the notebooks from scratch.
    """
    if task == "pretrain":
        if not fits(MAIN_JOB):
            announce(MAIN_JOB, "the README's main job, 6 to 9 min on 2 CPU cores")
            run(["--objective", "pmlm", "--out_dir", str(MAIN_JOB.parent), "--overwrite", "true"])
        return MAIN_JOB
    if (objective, task) not in FINETUNE:
        known = ", ".join(f"{o!r} on {t!r}" for o, t in FINETUNE)
        raise ValueError(f"{objective!r} on {task!r}: the notebooks fine-tune {known}")
    steps, flags = FINETUNE[objective, task]
    out = CACHE / "notebooks" / f"{objective}-{task}"
    pretrained = tiny_checkpoint("pmlm")
    args = ["--objective", objective, "--task", "seq2seq", "--data", str(lead_task_file(task)),
            "--init_from", str(pretrained), "--max_steps", str(steps), *flags,
            "--out_dir", str(out), "--overwrite", "true"]
    # what the checkpoint was made from: these settings and this main job
    recipe = json.dumps({"args": args, "pretrained": pretrained.stat().st_mtime_ns})
    stamp = out / "recipe.json"
    if not (fits(out / "ckpt.pt") and stamp.exists() and stamp.read_text() == recipe):
        announce(out / "ckpt.pt", f"{steps} steps of fine-tuning from the main job")
        seconds = run(args + QUIET)
        # how long the fine-tuning took here: a notebook states its budget in steps and seconds
        (out / "built.json").write_text(json.dumps({"seconds": seconds}))
        stamp.write_text(recipe)
    return out / "ckpt.pt"


def build_seconds(path):
    """Seconds train.py took to fine-tune this checkpoint on this machine (None if unknown)."""
    built = Path(path).parent / "built.json"
    return json.loads(built.read_text())["seconds"] if built.exists() else None


def load_model(path):
    """(model in eval mode, tokenizer) of any train.py checkpoint, pre-training ones included (generate.py's
    loader takes only fine-tuned ones); a file that does not fit this code is a utils.UsageError."""
    import model as M
    import utils
    from tokenizer import WordPiece
    ckpt = utils.read_checkpoint(path)
    try:
        net = M.Transformer(M.ModelConfig.from_dict(ckpt["model_config"]))
        net.load_state_dict({k.removeprefix("_orig_mod.").removeprefix("module."): v
                             for k, v in ckpt["model"].items()})
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        raise utils.UsageError(f"{path}: the checkpoint does not fit this code ({type(e).__name__})") from None
    return net.eval(), WordPiece(ckpt["vocab"], lowercase=ckpt.get("lowercase", True))


def fits(path):
    """Whether a checkpoint exists and loads into this code's model."""
    import utils
    if not path.exists():
        return False
    try:
        load_model(path)
    except utils.UsageError:
        return False
    return True


def prepare():
    """Build every checkpoint the notebooks read (what `python notebooks/common.py` runs)."""
    for objective, task in FINETUNE:
        print(f"{objective}: {tiny_checkpoint(objective, task).relative_to(ROOT)}", flush=True)


def announce(path, what):
    # a notebook's first output says what is missing and which command builds everything at once
    state = "is missing" if not path.exists() else "is out of date"
    print(f"{path.relative_to(ROOT)} {state}: building it now ({what}).\n"
          f"`{PREPARE}` builds every checkpoint the notebooks read, once.", flush=True)


def run(args):
    """Run `python train.py ARGS` from the repository root, its log shown line by line -> its seconds."""
    start = time.time()
    with subprocess.Popen([sys.executable, "train.py"] + args, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            print("  " + line.rstrip(), flush=True)
    if proc.returncode:
        raise RuntimeError(f"train.py {' '.join(args)} failed (exit status {proc.returncode})")
    seconds = round(time.time() - start)
    print(f"  built in {seconds} s", flush=True)
    return seconds


def heatmap(ax, matrix, rows=None, cols=None, title=None, cmap="Blues", vmax=None, colorbar=None):
    """Draw a (rows x cols) matrix with token labels; True / large = dark. colorbar: its label, if any."""
    import numpy as np
    values = np.asarray(matrix, dtype=float)
    image = ax.imshow(values, cmap=cmap, vmin=0, vmax=vmax if vmax is not None else max(values.max(), 1e-12),
                      aspect="auto", interpolation="nearest")
    if cols is not None:
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    if rows is not None:
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("key (input)")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02).set_label(colorbar, fontsize=8)
    return image


def mask_legend(where):
    """The key of a boolean mask drawn by heatmap (dark = may attend), beside an axes or atop a figure."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch
    handles = [Patch(facecolor=colormaps["Blues"](1.0), label="may attend"),
               Patch(facecolor="white", edgecolor="grey", label="may not")]
    if hasattr(where, "add_subplot"):                    # a figure: top right, above the panels
        where.legend(handles=handles, fontsize=7, loc="upper right", frameon=False)
    else:                                                # an axes: outside its right edge
        where.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


if __name__ == "__main__":
    # every checkpoint the notebooks read, built once (the README's notebook commands run this first)
    t0 = time.time()
    prepare()
    print(f"the notebooks' checkpoints are ready ({time.time() - t0:.0f} s)")

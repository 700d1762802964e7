"""What the notebooks share: the project on the import path, small trained checkpoints, one heatmap.

    import common                                   # first cell of every notebook (run from notebooks/)
    path = common.tiny_checkpoint("pmlm")           # the README's main job (out/pmlm-pretrain), or one like it
    path = common.tiny_checkpoint("palm", task="seq2seq")   # fine-tuned on the docsum task
    common.heatmap(ax, mask, rows, cols)            # a boolean or float matrix with readable token labels
    python notebooks/common.py                      # build every checkpoint the notebooks use (CI does, first)

The checkpoints are built by train.py itself (nothing re-implemented here) with the tiny preset's laptop recipe,
and cached in .cache/notebooks/ at the repository root, so the notebooks share them. Pre-training is the README's
main job when out/pmlm-pretrain/ckpt.pt exists (one UniLMv2 checkpoint serves every notebook: each objective then
fine-tunes it with its own recipe, as train.py allows); otherwise a shorter run of the same recipe. They are
classroom models: small and briefly trained.
"""
import contextlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import train  # noqa: E402  (after the path is set)

CACHE = ROOT / ".cache"
MAIN_JOB = ROOT / "out" / "pmlm-pretrain" / "ckpt.pt"
COMMON = ["--eval_interval", "100000", "--eval_batches", "1", "--log_interval", "50", "--progress", "false",
          "--cache_dir", str(CACHE), "--overwrite", "true"]
# fine-tuning steps on the docsum task, by objective (PALM's copy head is the slow one on a CPU)
FINETUNE_STEPS = {"pmlm": 400, "unilm": 400, "ernie_gen": 300, "palm": 150}


def tiny_checkpoint(objective="pmlm", task="pretrain", quiet=True):
    """Path of a tiny checkpoint: pre-training (UniLMv2, the main job's) or `objective`'s fine-tuning of it."""
    if task == "pretrain":
        return pretrained(quiet)
    out = CACHE / "notebooks" / f"{objective}-seq2seq"
    if not (out / "ckpt.pt").exists():
        run(["--objective", objective, "--task", "seq2seq", "--init_from", str(pretrained(quiet)),
             "--max_steps", str(FINETUNE_STEPS[objective]), "--out_dir", str(out)], quiet)
    return out / "ckpt.pt"


def pretrained(quiet=True):
    """The README's main job if it ran (python train.py --objective pmlm), else 600 steps of its recipe."""
    if MAIN_JOB.exists():
        return MAIN_JOB
    out = CACHE / "notebooks" / "pmlm-pretrain"
    if not (out / "ckpt.pt").exists():
        run(["--objective", "pmlm", "--max_steps", "600", "--out_dir", str(out)], quiet)
    return out / "ckpt.pt"


def run(args, quiet):
    # train.py prints a banner and its last words; a notebook only needs the checkpoint
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        train.main(args + COMMON)


def heatmap(ax, matrix, rows=None, cols=None, title=None, cmap="Blues", vmax=None):
    """Draw a (rows x cols) matrix with token labels; True / large = dark."""
    import numpy as np
    values = np.asarray(matrix, dtype=float)
    ax.imshow(values, cmap=cmap, vmin=0, vmax=vmax if vmax is not None else max(values.max(), 1e-12),
              aspect="auto", interpolation="nearest")
    if cols is not None:
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    if rows is not None:
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("key (input)")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title, fontsize=9)


if __name__ == "__main__":
    # every checkpoint the notebooks use, built once (CI runs this before timing the notebooks)
    for name in ("palm", "ernie_gen"):
        print(f"{name}: {tiny_checkpoint(name, 'seq2seq', quiet=False)}", flush=True)

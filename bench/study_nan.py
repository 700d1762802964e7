"""Issue 22: why some fine-tunings from random weights stop on a non-finite loss.

At fine-tuning lr 1e-3 the SQuAD QG controls of unilm and ernie_gen (random weights, eager, bf16 on CUDA)
stopped on a NaN loss in 5 of 6 cells of the study, and unilm's in 2 of 2 when run again; their loss and
gradient norm were healthy up to the last log before it (metrics.jsonl). This runs ONE such cell of the study
(bench/study.py's own fine-tuning, decoding and scoring), with the model's attention done one of these ways:

    sdpa      model.attention as it is: F.scaled_dot_product_attention with the boolean mask
    additive  the same call with the mask as an additive float bias, the dtype's most negative finite
              number where the mask says no (a forbidden key's weight is still exactly 0)
    naive     model.naive_attention: the softmax written out (Vaswani et al. Eq. 1)
    sdpa_efficient, sdpa_cudnn, sdpa_math   model.attention with SDPA held to one of its backends
              (torch.nn.attention.sdpa_kernel): which fused kernel it is

    python bench/study_nan.py prepare --out DIR                 # the caches and SQuAD's split, once
    python bench/study_nan.py WAY SYSTEM SEED --out DIR         # one cell -> one JSON line on stdout
    python bench/study_nan.py WAY SYSTEM SEED --out DIR --train_only   # the fine-tuning only, no scores
    python bench/study_nan.py backend                           # the backend SDPA picks for these shapes

`bench/study_nan_gpu.sh` runs every way on the cells that stopped, several at once on one GPU. Found (fifteenth
session, one H100, torch 2.11; bench/RESULTS.md): SDPA picks cuDNN's kernel for these batches; on it (and with the
additive mask) the controls stopped in about half the runs or more, written out in none of 10, held to the
memory-efficient kernel or the math backend in none of 2 each.
"""
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import model as M  # noqa: E402
from bench import study  # noqa: E402

# the study's settings of these cells (the ft-lr-1e-3 study, SQuAD QG only)
STUDY_FLAGS = ["--ft_lr", "1e-3", "--tasks", "squad_qg"]


def additive_attention(q, k, v, mask, bias=None, impl="sdpa", dropout_p=0.0):
    """SDPA with the mask as a float bias: 0 where a key may be seen, the most negative finite number where not."""
    lowest = torch.finfo(q.dtype).min
    if bias is None:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, lowest)[:, None]
    else:
        bias = bias.to(q.dtype).clamp(min=lowest)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)


# model.attention as model.py has it (main() replaces the module's name with a way)
READABLE = M.attention


def held_to(backend):
    """model.attention with SDPA allowed only this backend (an error where it cannot run the inputs)."""
    def attention(*args, **kwargs):
        with sdpa_kernel(backend):
            return READABLE(*args, **kwargs)
    return attention


WAYS = {"sdpa": READABLE, "additive": additive_attention,
        "naive": lambda q, k, v, mask, bias=None, impl="sdpa", dropout_p=0.0:
        M.naive_attention(q, k, v, mask, bias, dropout_p),
        "sdpa_efficient": held_to(SDPBackend.EFFICIENT_ATTENTION), "sdpa_cudnn": held_to(SDPBackend.CUDNN_ATTENTION),
        "sdpa_math": held_to(SDPBackend.MATH)}


def backend_of_these_shapes():
    """The backend SDPA picks on this GPU for a SQuAD QG fine-tuning batch (bf16, a boolean mask, dropout)."""
    q = torch.randn(64, 8, 156, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(64, 1, 156, 156, device="cuda", dtype=torch.bool)
    choice = torch._fused_sdp_choice(q, q, q, mask, 0.1, False)
    return SDPBackend(choice).name


def main(argv):
    if argv[:1] == ["backend"]:
        print(f"SDPA's backend here: {backend_of_these_shapes()} ({torch.cuda.get_device_name()}, "
              f"torch {torch.__version__})")
        return
    if argv[:1] == ["prepare"]:
        args = study.parse_args(STUDY_FLAGS + argv[1:])
        study.prepare(study.settings(args), args, ernie=False)
        return
    way, name, seed, rest = argv[0], argv[1], int(argv[2]), argv[3:]
    if "--train_only" in rest:
        # whether the fine-tuning stops is the question: no decoding, no scores
        rest.remove("--train_only")
        study.score = lambda *a: {}
        study.finetune_flops = lambda *a: 0.0
    args = study.parse_args(STUDY_FLAGS + rest)
    cfg = study.settings(args)
    # model.SelfAttention calls the module's `attention` at every forward
    M.attention = WAYS[way]
    study.run_cell(name, "squad_qg", seed, cfg, args)
    staged = Path(args.out) / "staged" / f"{study.cell_stem(name, 'squad_qg', seed)}.json"
    cell = json.loads(staged.read_text())
    bleu = (cell.get("scores") or {}).get("bleu")
    print(json.dumps(dict(way=way, system=name, seed=seed, diverged=bool(cell.get("diverged")),
                          bleu=bleu["f"] if bleu else None, seconds=cell["finetune"]["seconds"])))


def nan_step(log_text):
    """The step train.py named when it stopped on a non-finite loss, or None."""
    found = re.search(r"non-finite loss \S+ at step (\d+)", log_text)
    return int(found[1]) if found else None


if __name__ == "__main__":
    main(sys.argv[1:])

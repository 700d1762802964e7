"""How much of a pre-training batch is padding, per objective, one passage a row against packed rows.

    python bench/padding.py                                   # the embedded corpus, base settings
    python bench/padding.py --data /path/to/corpus            # a text file or folder (train.py --data)
    python bench/padding.py --batches 20 --batch 32 --seq_len 512

Batches are train.py's: data.prepare_pretrain's passages of seq_len - 3 tokens, data.batch_at's draw of
`batch` of them, the objective's make_batch (PALM in stage 2, with its continuation; ERNIE-GEN without a span
vocabulary, which changes no length). For each objective the table gives the share of padding positions in
the tensors the blocks run on (B x L), over `batches` batches:
  one a row      the objective's own batch: every passage in its own row, padded to the longest
  packed         fast.plan_packing: passages packed several to a row, rows of fast.pack_width (the longest
                 passage or a little wider, whichever costs the blocks least): `sdpa` prices a row's width with
                 the preset's dense attention (fast.key_cost: every key of the row is computed), `flex` at no
                 cost (FlexAttention skips the tiles between passages), as train.py does for each path
  x64            the same with lengths rounded up to a multiple of 64 (train.py's setting when it compiles)
  steady x64     fast.SteadyPacking: every batch in rows of one width, the widest passage yet to 64 (train.py
                 --pack true with compiled blocks, so that only the count of rows changes)
  within 5%      each batch at the cheapest width x64 (priced for SDPA) whose rows are at most 5% padding
                 (fast.plan_packing's max_padding), else the one with the fewest slots
and rows, the rows the packed batch has (the batch's passages in fewer rows); last, the rows the model runs per
corpus token it reads (pmlm's [M] and [P] rows, ERNIE-GEN's [ATTN] rows): a bound on corpus tokens/s at any
padding. Runs on a CPU in seconds (after the corpus's vocabulary and tokens are cached).

    python bench/padding.py --steady_widths 512,640,1024,1280     # + steady rows from wider starts
    python bench/padding.py --only palm --options copy=false      # objective options (PALM without its copy head)

--steady_widths also packs every batch in SteadyPacking's rows from each of these widths (a wider row
holds more passages, so its last slots are a smaller share; dense attention costs more a token): the
padding, and the blocks' FLOPs against steady x64's.
"""
import argparse
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch                                        # noqa: E402

import data                                         # noqa: E402
import fast                                         # noqa: E402
import model as M                                   # noqa: E402
from config import parse_args                        # noqa: E402
from objectives import get_objective                # noqa: E402
from objectives.masks import PAD                    # noqa: E402
from utils import UsageError                         # noqa: E402

NAMES = ("unilm", "pmlm", "ernie_gen", "palm", "mass")


def padding(batches, multiple, packing, key_cost=0.0, steady=False, start=0, max_padding=None):
    """Share of padding slots over the batches' (rows x width) tensors -> (share, rows per batch).
    steady: fast.SteadyPacking's rows (one width for all batches: train.py --pack on CUDA), from a
    width of `start` (it widens to a longer row); max_padding: fast.plan_packing's cheapest width whose
    rows are at most this share padding."""
    real = slots = rows = 0
    plan = fast.SteadyPacking(multiple)
    plan.width = start
    for batch in batches:
        real += int((batch.kind != PAD).sum())
        if packing and steady:
            n, width = plan(batch).extras["pack_shape"]
        elif packing:
            n, width = fast.plan_packing(batch, multiple, key_cost, max_padding=max_padding).extras["pack_shape"]
        else:
            n, L = batch.kind.shape
            width = fast.round_up(L, multiple)
        slots += n * width
        rows += n
    return 1 - real / slots, rows / len(batches)


def key_cost(preset, vocab_size):
    """fast.key_cost of the preset's model (built on the meta device: shapes only, no memory)."""
    with torch.device("meta"):
        model = M.Transformer(M.ModelConfig(**{**M.PRESETS[preset], "vocab_size": vocab_size}))
    return fast.key_cost(model)


def measure(name, passages, tok, args):
    obj = get_objective(name, tok, max_len=args.seq_len, **args.options[name])
    obj.set_step(10 ** 9, 10 ** 9)                 # PALM: stage 2, the continuation included
    batches = []
    for k in range(args.batches):
        examples = data.batch_at(passages, args.batch, args.seed, k)
        batches.append(obj.make_batch(examples, random.Random(f"{args.seed}:0:{k}:0")))
    row = {"objective": name}
    # the rows the model runs per corpus token read ([P], [ATTN], [M] rows add to the text): a bound on
    # corpus tokens/s at any padding, whatever the kernels
    row["per corpus token"] = (sum(int((b.kind != PAD).sum()) for b in batches)
                               / sum(obj.corpus_tokens(b) for b in batches))
    row["one a row"], _ = padding(batches, 1, False)
    row["one a row x64"], _ = padding(batches, 64, False)
    cost_per_key = key_cost(args.preset, len(tok))
    row["sdpa"], row["rows"] = padding(batches, 1, True, cost_per_key)
    row["sdpa x64"], row["rows x64"] = padding(batches, 64, True, cost_per_key)
    row["flex"], _ = padding(batches, 1, True, 0.0)
    row["flex x64"], _ = padding(batches, 64, True, 0.0)
    row["steady x64"], row["rows steady"] = padding(batches, 64, True, steady=True)
    row["within 5%"], _ = padding(batches, 64, True, cost_per_key, max_padding=0.05)
    # what the rows from each start cost the blocks with dense attention, against steady x64's
    steady = cost(batches, 0, cost_per_key) if args.steady_widths else None
    for width in args.steady_widths:
        row[f"steady {width}"], _ = padding(batches, 64, True, steady=True, start=width)
        row[f"cost {width}"] = cost(batches, width, cost_per_key) / steady
    return row


def cost(batches, width, key_cost):
    """The blocks' FLOPs over the batches in SteadyPacking's rows from `width`, dense attention
    (fast.pack_width's measure: rows * width * (1 + key_cost * width))."""
    plan = fast.SteadyPacking(64)
    plan.width = width
    total = 0.0
    for batch in batches:
        n, w = plan(batch).extras["pack_shape"]
        total += n * w * (1 + key_cost * w)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="", help="a text file or folder; '' = the embedded corpus")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--preset", default="base", help="the model size whose attention cost picks the width")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--cache", default=".cache")
    ap.add_argument("--only", default=",".join(NAMES))
    ap.add_argument("--options", default="", help="objective options for every objective, KEY=VALUE,... "
                    "(copy=false: PALM without its copy head, whose contexts are padded to one width)")
    ap.add_argument("--steady_widths", default="",
                    help="comma-separated widths: also SteadyPacking's rows starting at each (padding, and "
                         "their dense-attention FLOPs over steady x64's)")
    args = ap.parse_args()
    args.steady_widths = [int(w) for w in args.steady_widths.split(",") if w]
    # "copy=false,mask_prob=0.2" -> each objective's {"copy": False, ...}, typed by train.py's own parser
    flags = ["--" + kv for kv in args.options.split(",") if kv]              # --copy=false
    try:
        options = {}
        for name in args.only.split(","):
            _, _, options[name], given = parse_args(["--objective", name] + flags)
            if not_objective := given - {"objective"} - set(options[name]):
                raise UsageError(f"--options {','.join(sorted(not_objective))}: not an option of objective {name}")
    except UsageError as e:
        ap.error(str(e))
    args.options = options
    tok, splits, info = data.prepare_pretrain(args.data or None, args.vocab, args.cache,
                                              max_tokens=args.seq_len - 3, progress=True)
    passages = splits["train"]
    warnings.simplefilter("ignore")                # truncation and span-vocabulary notices
    rows = [measure(name, passages, tok, args) for name in args.only.split(",")]
    print(f"\n{args.data or 'the embedded corpus'}: {len(passages)} passages, text {args.seq_len}, "
          f"batch {args.batch}, {args.batches} batches, vocab {len(tok)}, preset {args.preset}")
    print("| objective | one a row | packed, sdpa | packed, flex | rows (sdpa) | one a row x64 | packed x64, sdpa "
          "| packed x64, flex | rows x64 | steady x64 | rows steady | x64 within 5% | real rows per corpus token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['objective']} | {r['one a row']:.1%} | {r['sdpa']:.1%} | {r['flex']:.1%} | {r['rows']:.1f} | "
              f"{r['one a row x64']:.1%} | {r['sdpa x64']:.1%} | {r['flex x64']:.1%} | {r['rows x64']:.1f} | "
              f"{r['steady x64']:.1%} | {r['rows steady']:.1f} | {r['within 5%']:.1%} | {r['per corpus token']:.3f} |")
    if args.steady_widths:
        print("\nsteady rows from a wider start: padding (the blocks' FLOPs with dense attention over steady x64's)")
        print("| objective | " + " | ".join(f"from {w}" for w in args.steady_widths) + " |")
        print("|---|" + "---|" * len(args.steady_widths))
        for r in rows:
            print(f"| {r['objective']} | " + " | ".join(f"{r[f'steady {w}']:.1%} ({r[f'cost {w}']:.2f}x)"
                                                   for w in args.steady_widths) + " |")


if __name__ == "__main__":
    main()

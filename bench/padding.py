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
and rows, the rows the packed batch has (the batch's passages in fewer rows). Runs on a CPU in seconds
(after the corpus's vocabulary and tokens are cached).

    python bench/padding.py --speed tiny --seq_len 128 --batch 16 --batches 12    # + training speed on a CPU

    python bench/padding.py --steady_widths 512,640,1024,1280     # + steady rows from wider starts
    python bench/padding.py --only palm --options copy=false      # objective options (PALM without its copy head)

--steady_widths also packs every batch in SteadyPacking's rows from each of these widths (a wider row
holds more passages, so its last slots are a smaller share; dense attention costs more a token): the
padding, and the blocks' FLOPs against steady x64's.

--speed PRESET also times training steps (forward, backward, AdamW) of a PRESET model on this device, train.py's
way (on CUDA: the blocks compiled for any shape, bf16, fused AdamW, lengths to a multiple of 64), every batch on
every layout in turn (a different order each batch, so that a busy machine slows them alike): one passage a row;
steady (train.py --pack true: fast.SteadyPacking); each batch at its own width priced for SDPA's dense attention
(fast.plan_packing with fast.key_cost); each batch at the width with the fewest slots (key_cost 0); each batch at
the cheapest width whose rows are at most 5% padding (plan_packing's max_padding). tokens/s are
real tokens (padding excluded) over the median step time, the first --speed_warmup batches left out; the fastest
steps' ratio beside it (on a machine shared with other work the fastest step is the steadier figure).

    python bench/padding.py --speed base --batches 60 --speed_warmup 8 --vocab 30522    # on a GPU
"""
import argparse
import functools
import random
import statistics
import sys
import time
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


def padding(batches, multiple, packing, key_cost=0.0, steady=False, start=0):
    """Share of padding slots over the batches' (rows x width) tensors -> (share, rows per batch).
    steady: fast.SteadyPacking's rows (one width for all batches: train.py --pack on CUDA), from a
    width of `start` (it widens to a longer row)."""
    real = slots = rows = 0
    plan = fast.SteadyPacking(multiple)
    plan.width = start
    for batch in batches:
        real += int((batch.kind != PAD).sum())
        if packing and steady:
            n, width = plan(batch).extras["pack_shape"]
        elif packing:
            n, width = fast.plan_packing(batch, multiple, key_cost).extras["pack_shape"]
        else:
            n, L = batch.kind.shape
            width = -(-L // multiple) * multiple
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


def layouts(model, multiple):
    """The packings --speed compares: name -> what packs a batch (None: one passage a row). x64 where
    the blocks are compiled (train.py's multiple), else 1."""
    cost = fast.key_cost(model)
    return {"one a row": None,
            f"steady x{multiple}": fast.SteadyPacking(multiple),                 # train.py --pack true
            f"x{multiple} priced for sdpa": functools.partial(fast.plan_packing, multiple=multiple, key_cost=cost),
            f"x{multiple} fewest slots": functools.partial(fast.plan_packing, multiple=multiple, key_cost=0.0),
            f"x{multiple} cheapest within 5%": functools.partial(fast.plan_packing, multiple=multiple, key_cost=cost,
                                                                 max_padding=0.05)}


def speed(name, passages, tok, args):
    """Training steps (forward, backward, AdamW) of the --speed preset on each layout of the same batches,
    train.py's way on this device (on CUDA: blocks compiled for any shape, bf16, fused AdamW, lengths to
    a multiple of 64). -> {layout: (median step s, fastest step s, padding)}, real tokens per step."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    obj = get_objective(name, tok, max_len=args.seq_len, **args.options[name])
    obj.set_step(10 ** 9, 10 ** 9)
    cfg = M.ModelConfig(**{**M.PRESETS[args.speed], "vocab_size": len(tok), **obj.model_defaults})
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(device)
    if cuda:
        obj.pad_multiple = 64
        fast.speed_up(model, compile=True, dynamic=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    plans = layouts(model, 64 if cuda else 1)
    times = {k: [] for k in plans}
    slots = dict.fromkeys(plans, 0)
    real, warmup = 0, args.speed_warmup
    for k in range(args.batches):
        examples = data.batch_at(passages, args.batch, args.seed, k)
        batch = obj.make_batch(examples, random.Random(f"{args.seed}:0:{k}:0"))
        if k >= warmup:
            real += batch.n_tokens
        # a different order each batch: a machine that slows down mid-way slows every layout alike
        order = list(plans)[k % len(plans):] + list(plans)[:k % len(plans)]
        for layout in order:
            plan = plans[layout]
            # a copy of the batch for each layout (plan_packing writes the batch's extras)
            b = plan(batch._map(lambda t: t)) if plan else batch
            n, width = b.extras.get("pack_shape", b.input_ids.shape)
            b = b.to(device)
            t0 = time.perf_counter()
            with autocast:
                loss = obj.loss(fast.packed(model, b), b)[0]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            if k >= warmup:
                times[layout].append(time.perf_counter() - t0)
                slots[layout] += n * width
    return {k: (statistics.median(t), min(t), 1 - real / slots[k]) for k, t in times.items()}, \
        real / (args.batches - warmup)


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
    ap.add_argument("--speed", default="", help="a preset: also time its training steps on each layout")
    ap.add_argument("--speed_warmup", type=int, default=1,
                    help="--speed: batches left out of the timing (compilation on a GPU)")
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
    if args.speed and not 0 <= args.speed_warmup < args.batches:
        ap.error(f"--speed_warmup {args.speed_warmup} must be in [0, --batches {args.batches})")
    tok, splits, info = data.prepare_pretrain(args.data or None, args.vocab, args.cache,
                                              max_tokens=args.seq_len - 3, progress=True)
    passages = splits["train"]
    warnings.simplefilter("ignore")                # truncation and span-vocabulary notices
    rows = [measure(name, passages, tok, args) for name in args.only.split(",")]
    print(f"\n{args.data or 'the embedded corpus'}: {len(passages)} passages, text {args.seq_len}, "
          f"batch {args.batch}, {args.batches} batches, vocab {len(tok)}, preset {args.preset}")
    print("| objective | one a row | packed, sdpa | packed, flex | rows (sdpa) | one a row x64 | packed x64, sdpa "
          "| packed x64, flex | rows x64 | steady x64 | rows steady | real rows per corpus token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['objective']} | {r['one a row']:.1%} | {r['sdpa']:.1%} | {r['flex']:.1%} | {r['rows']:.1f} | "
              f"{r['one a row x64']:.1%} | {r['sdpa x64']:.1%} | {r['flex x64']:.1%} | {r['rows x64']:.1f} | "
              f"{r['steady x64']:.1%} | {r['rows steady']:.1f} | {r['per corpus token']:.3f} |")
    if args.steady_widths:
        print("\nsteady rows from a wider start: padding (the blocks' FLOPs with dense attention over steady x64's)")
        print("| objective | " + " | ".join(f"from {w}" for w in args.steady_widths) + " |")
        print("|---|" + "---|" * len(args.steady_widths))
        for r in rows:
            print(f"| {r['objective']} | " + " | ".join(f"{r[f'steady {w}']:.1%} ({r[f'cost {w}']:.2f}x)"
                                                   for w in args.steady_widths) + " |")
    if not args.speed:
        return
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else \
        f"{torch.get_num_threads()} CPU thread(s)"
    print(f"\ntraining steps of the {args.speed} preset on {device}, torch {torch.__version__}, "
          f"{args.batches - args.speed_warmup} batches after {args.speed_warmup} of warm-up, each on every layout")
    print("| objective | layout | padding | step ms | tokens/s | vs one a row | fastest steps vs one a row |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        result, tokens = speed(name, passages, tok, args)
        base = result["one a row"]
        for layout, (sec, fastest, pad) in result.items():
            print(f"| {name} | {layout} | {pad:.1%} | {sec * 1000:.1f} | {tokens / sec:,.0f} | "
                  f"{base[0] / sec:.2f}x | {base[1] / fastest:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

"""Training throughput on one GPU: every objective and attention path, bare steps and train.py's own loop, against
HF BertForMaskedLM (eager and compiled) and the card's measured bf16 matmul peak, all in ONE run.

    python bench/bench_train.py --part bare      # matmul peak, HF eager + compiled, every objective x path
    python bench/bench_train.py --part loop      # train.py itself, every objective at its default path
    python bench/bench_train.py --part large     # the large preset: the biggest batch that fits, and its MFU
    python bench/bench_train.py --tiny           # CPU smoke run of the bare part (a small model, a few steps)
    python bench/bench_train.py --pack both      # every objective one passage a row AND packed (fast.plan_packing)

Data: the embedded corpus through data.prepare_pretrain, as train.py reads it (passages of seq_len - 3 tokens, a
vocabulary of --vocab pieces trained on it), so a bare step and a train.py step see the same batches.
  tokens/s      rows the model processes per second ([P] / [ATTN] rows included), padding excluded
  corpus tok/s  corpus tokens per second (objective.corpus_tokens: context and target, not the added queries)
  MFU           model FLOPs (model.estimate_flops) per second over the datasheet's dense bf16 peak (model.PEAK_FLOPS)
  peak GiB      torch.cuda.max_memory_allocated over the timed steps
  padding       the share of the (rows x L) positions the blocks run on that are padding
--pack on runs the objectives with several passages packed into each row (train.py --pack true: the blocks see
rows of the width of the longest passage, fewer of them; the objective's loss is the same); --pack both measures
each objective both ways in the same run, beside HF's rows that have no padding.
A bare step is forward + backward + AdamW on batches already on the GPU, with the blocks compiled as train.py does
on CUDA (eager for the naive path); train.py's loop adds everything else (batches built by DataLoader workers,
copied, logged), measured from its own metrics.jsonl after the compilation steps. HF's BertForMaskedLM (same
shape and vocabulary, sdpa attention, every row through its MLM head) is the baseline. Prints markdown tables
last; writes bench_<part>.json to $OUT when set.
"""
import argparse
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data                                         # noqa: E402
import fast                                         # noqa: E402
import model as M                                   # noqa: E402
from objectives import get_objective                # noqa: E402
from tokenizer import SPECIAL_TOKENS                # noqa: E402

RUNS = [("unilm", {}, "unilm"), ("pmlm", {}, "pmlm"), ("ernie_gen", {}, "ernie_gen"),
        ("palm", {}, "palm (copy)"), ("palm", {"copy_scores": "compiled"}, "palm (compiled copy)"),
        ("palm", {"copy": False}, "palm (no copy)")]


def split_options(options):
    """A RUNS entry's options -> (how fast.speed_up computes PALM's copy scores on CUDA, the
    objective's options): "copy_scores" is the one that is not the objective's."""
    rest = dict(options)
    return rest.pop("copy_scores", "auto"), rest


def passages(n, length, vocab_size, rng):
    """n synthetic passages of `length` tokens cut into sentences of 8-40 tokens."""
    out = []
    for _ in range(n):
        sents, left = [], length
        while left > 0:
            k = min(left, rng.randint(8, 40))
            sents.append([rng.randrange(len(SPECIAL_TOKENS), vocab_size) for _ in range(k)])
            left -= k
        out.append(sents)
    return out


def corpus(args):
    """The embedded corpus as train.py reads it: (tokenizer, training passages)."""
    tok, splits, _ = data.prepare_pretrain(None, args.vocab, args.cache, max_tokens=args.seq_len - 3,
                                           progress=False)
    return tok, splits["train"]


def shape(batch):
    """What a compiled step specialises on: the packed shape, else the tensors' (None: no Batch)."""
    if not hasattr(batch, "extras"):
        return None
    return batch.extras.get("pack_shape", tuple(batch.input_ids.shape))


def timed(step_fn, batches, warmup, device, settle=False):
    """Median seconds of one step over batches[warmup:] (device-synchronised). Every shape of the timed batches
    is compiled before the clock starts: the warm-up batches, then one timed batch of each shape not seen yet
    (settle: every batch twice, so that a CUDA-graph step has captured every graph it replays: the first pass grows
    its steady shape, the second captures at the shape that stays)."""
    seen = {shape(b) for b in batches[:warmup]}
    first_of_shape = {shape(b): b for b in reversed(batches[warmup:]) if shape(b) not in seen}
    for b in batches * 2 if settle else batches[:warmup] + list(first_of_shape.values()):
        step_fn(b)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for b in batches[warmup:]:
        t0 = time.perf_counter()
        step_fn(b)
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_gib(device):
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")


def matmul_peak(device):
    """The card's bf16 matrix-product rate, measured (8192^3, random data)."""
    if device.type != "cuda":
        return float("nan")
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    sec = timed(lambda _: a @ b, [None] * 13, 3, device)
    return 2 * 8192 ** 3 / sec


def build_step(name, impl, options, tok, examples, args, device, preset=None, batch=None, pack=False,
               dynamic=False, graph=False, steady=False):
    """A model, its objective, warm-up + timed batches already on the device, and one training step on them.
    pack: several passages a row (train.py --pack true); dynamic: the blocks compiled for any shape; graph: the
    forward, loss and backward replayed as a CUDA graph at a steady padded shape (fast/train_graph.py); steady:
    packed rows of one width (fast.SteadyPacking, which a CUDA-graph step always uses)."""
    preset = preset or args.preset
    batch_size = batch or args.batch
    copy_scores, options = split_options(options)
    obj = get_objective(name, tok, max_len=M.PRESETS[preset]["max_position"], **options)
    obj.set_step(10 ** 9, 10 ** 9)                 # PALM: stage 2 (continuation + copy)
    cfg = M.ModelConfig(**{**M.PRESETS[preset], "vocab_size": len(tok), "dropout": 0.1, "attn_impl": impl,
                           **obj.model_defaults, **getattr(args, "model_overrides", {})})
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(device)
    compiled = device.type == "cuda" and impl != "naive" and not args.eager
    whole = getattr(args, "whole", "")
    # the fast layer as train.py switches it on: BucketBias and fast copy scores on CUDA, compiled blocks
    # (--whole: no compiled blocks; the forward and the loss compiled as one function, below)
    fast.speed_up(model, compile=compiled and not whole, dynamic=dynamic, copy_scores=copy_scores)
    if compiled:
        obj.pad_multiple = 64                      # as train.py does when it compiles
    rng = random.Random(0)
    n = args.warmup + args.steps
    raw = [rng.sample(examples, batch_size) for _ in range(n)]
    t0 = time.perf_counter()
    batches = [obj.make_batch(ex, random.Random(k)) for k, ex in enumerate(raw)]
    make_ms = (time.perf_counter() - t0) / n * 1000
    if pack:
        # train.py --pack true: rows widths a multiple of 64 where compiled, as the unpacked lengths are
        key_cost = fast.key_cost(model)            # 0 on flex: it skips the tiles between passages
        # widths a multiple of 64 for static compiled shapes (train.py's); of 8 where compiled for any shape
        multiple = 8 if dynamic and compiled else obj.pad_multiple
        # a CUDA-graph step: one width for every batch (fast.SteadyPacking, as train.py packs compiled blocks)
        plan = (fast.SteadyPacking(obj.pad_multiple) if graph or steady
                else lambda b: fast.plan_packing(b, multiple, key_cost))
        batches = [plan(b) for b in batches]
    batches = [b.to(device) for b in batches]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def forward(b):
        return obj.loss(fast.packed(model, b), b)[0]
    if whole:
        # --whole: one graph for embeddings, blocks, heads and loss (fewer launches)
        forward = torch.compile(forward, mode=None if whole == "default" else whole)

    graphed = None
    if graph:
        import train
        from fast import train_graph
        graphed = train_graph.GraphedLoss(train.LossModule(model, obj, fast.packed), tok.pad_id)

    def step(b):
        if graphed is not None:
            graphed(b)
        else:
            with autocast:
                loss = forward(b)
            loss.backward()
        opt.step()
        # a graph adds into the same gradient tensors every replay: zeroed, never dropped
        opt.zero_grad(set_to_none=graphed is None)

    return dict(model=model, obj=obj, batches=batches, step=step, compiled=compiled, make_ms=make_ms,
                batch=batch_size)


def bench_objective(name, impl, options, label, tok, examples, args, device, preset=None, batch=None, pack=False,
                    graph=False):
    s = build_step(name, impl, options, tok, examples, args, device, preset, batch, pack,
                   dynamic=args.dynamic, graph=graph)
    model, obj, batches = s["model"], s["obj"], s["batches"]
    sec = timed(s["step"], batches, args.warmup, device, settle=graph)
    timed_batches = batches[args.warmup:]
    rows = sum(b.n_tokens for b in timed_batches) / args.steps
    corpus_rows = sum(obj.corpus_tokens(b) for b in timed_batches) / args.steps
    # the blocks' (rows, width) of each batch: packed or one passage a row
    shapes = [b.extras.get("pack_shape", tuple(b.input_ids.shape)) for b in timed_batches]
    slots = sum(n * width for n, width in shapes)
    flops = sum(b.n_tokens * model.estimate_flops(width, int((b.labels != -100).sum()) / b.n_tokens)
                for b, (_, width) in zip(timed_batches, shapes)) / args.steps
    label += (" packed" if pack else "") + (f" whole ({args.whole})" if getattr(args, "whole", "") else "")
    label += " CUDA graph" if graph else ""
    return dict(label=label, impl=impl, compiled=s["compiled"],
                seq=max(width for _, width in shapes), batch=s["batch"], rows=sum(n for n, _ in shapes) / args.steps,
                padding=1 - rows * args.steps / slots, tokens_s=rows / sec, corpus_tokens_s=corpus_rows / sec,
                flops_s=flops / sec, step_ms=sec * 1000, make_batch_ms=s["make_ms"], peak_gib=peak_gib(device))


def hf_step(args, device, vocab, compiled):
    """HF BertForMaskedLM (same shape and vocabulary, sdpa attention, every row through its MLM head), its
    warm-up + timed batches of random ids with no padding, and one training step on them."""
    from transformers import BertConfig, BertForMaskedLM
    p = M.PRESETS[args.preset]
    cfg = BertConfig(vocab_size=vocab, hidden_size=p["n_embd"], num_hidden_layers=p["n_layer"],
                     num_attention_heads=p["n_head"], intermediate_size=p["ffn_dim"],
                     max_position_embeddings=p["max_position"], attn_implementation="sdpa")
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).to(device)
    fwd = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    L = args.seq_len
    batches = []
    for _ in range(args.warmup + args.steps):
        ids = torch.randint(len(SPECIAL_TOKENS), vocab, (args.batch, L), generator=g)
        labels = torch.where(torch.rand(args.batch, L, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        batches.append((ids.to(device), labels.to(device)))

    def step(b):
        with autocast:
            loss = fwd(input_ids=b[0], attention_mask=torch.ones_like(b[0]), labels=b[1]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return dict(model=model, batches=batches, step=step)


def bench_hf(args, device, vocab, compiled):
    s = hf_step(args, device, vocab, compiled)
    model, batches, step = s["model"], s["batches"], s["step"]
    p = M.PRESETS[args.preset]
    L = args.seq_len
    sec = timed(step, batches, args.warmup, device)
    n_params = sum(q.numel() for q in model.parameters())
    n_emb = sum(q.numel() for n_, q in model.named_parameters() if "embeddings" in n_) + vocab  # + MLM bias
    d, layers = p["n_embd"], p["n_layer"]
    # the same formula as model.estimate_flops; HF sends every row through its MLM head (pred_frac = 1)
    per_token = 6 * (n_params - n_emb) + 12 * layers * d * L + 6 * d * vocab
    rows = args.batch * L
    label = "HF BertForMaskedLM" + (" (compiled)" if compiled else " (eager)")
    return dict(label=label, impl="sdpa", compiled=compiled, seq=L, batch=args.batch, rows=args.batch, padding=0.0,
                tokens_s=rows / sec,
                corpus_tokens_s=rows / sec, flops_s=rows * per_token / sec, step_ms=sec * 1000,
                make_batch_ms=float("nan"), peak_gib=peak_gib(device))


def bench_loop(name, options, label, args, device, pack=False, graph=False):
    """train.py itself, in this process: tokens/s, corpus tokens/s and MFU from its metrics.jsonl.
    pack: train.py --pack true; graph: train.py --graph true."""
    import train
    speed_up = fast.speed_up
    copy_scores, options = split_options(options)
    # train.py's fast.speed_up with this run's copy scores
    fast.speed_up = functools.partial(speed_up, copy_scores=copy_scores)
    out = Path(tempfile.mkdtemp(prefix=f"loop-{name}-"))
    flags = ["--objective", name, "--preset", args.preset, "--vocab_size", str(args.vocab), "--seq_len",
             str(args.seq_len), "--batch_size", str(args.batch), "--max_steps", str(args.loop_steps),
             "--log_interval", "10", "--eval_interval", "100000", "--ckpt_interval", "100000",
             "--cache_dir", args.cache, "--out_dir", str(out), "--progress", "false",
             "--pack", "true" if pack else "false", "--graph", "true" if graph else "false"]
    for key, value in options.items():
        flags += [f"--{key}", str(value).lower()]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    # each run compiles its own blocks: no earlier run's graphs, a count of this run's
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        train.main(flags)
    finally:
        fast.speed_up = speed_up
    suffix = (" packed" if pack else "") + (" CUDA graph" if graph else "")
    print(f"{label}{suffix}: the blocks compiled "
          f"{torch._dynamo.utils.counters['stats']['unique_graphs']} graph(s)", flush=True)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r["split"] == "train"][3:]          # after compilation and warm-up
    med = lambda key: statistics.median(r[key] for r in records) if records and key in records[0] else float("nan")
    return dict(label=label + suffix, impl="default", compiled=None, seq=args.seq_len,
                batch=args.batch, rows=float("nan"), padding=float("nan"),
                tokens_s=med("tokens_per_s"), corpus_tokens_s=med("corpus_tokens_per_s"),
                flops_s=med("mfu") * (M.peak_flops(device) or float("nan")), step_ms=float("nan"),
                make_batch_ms=float("nan"), peak_gib=peak_gib(device))


def table(rows, peak, title):
    print(f"\n{title}")
    print("| run | attention | compiled | batch | rows | L | padding | tokens/s | corpus tok/s | MFU | step ms "
          "| peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mfu = f"{r['flops_s'] / peak:.1%}" if peak else "-"
        print(f"| {r['label']} | {r['impl']} | {r['compiled']} | {r['batch']} | {r['rows']:.1f} | {r['seq']} | "
              f"{r['padding']:.1%} | {r['tokens_s']:,.0f} | {r['corpus_tokens_s']:,.0f} | {mfu} | "
              f"{r['step_ms']:.1f} | {r['peak_gib']:.1f} |")


def attempt(rows, fn, *a, **kw):
    """One row; a failure is printed and the others go on."""
    try:
        rows.append(fn(*a, **kw))
        print(rows[-1], flush=True)
    except Exception as e:
        print(f"{fn.__name__}{a[:2] if fn is not bench_hf else ''} failed: {type(e).__name__}: {str(e)[:500]}",
              file=sys.stderr, flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["bare", "loop", "large"], default="bare")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loop_steps", type=int, default=100)
    ap.add_argument("--impls", default="sdpa,flex")
    ap.add_argument("--only", default="", help="comma-separated run labels (default: all)")
    ap.add_argument("--cache", default=".cache")
    ap.add_argument("--eager", action="store_true", help="no compiled blocks")
    ap.add_argument("--whole", default="", help="torch.compile the whole forward + loss with this mode (default, "
                                                "max-autotune-no-cudagraphs, ...) instead of the blocks alone")
    ap.add_argument("--pack", choices=["off", "on", "both"], default="off",
                    help="several passages a row (train.py --pack): off, on, or both in one run")
    ap.add_argument("--graph", choices=["off", "on", "both"], default="off",
                    help="forward, loss and backward as a CUDA graph at a steady padded shape "
                         "(fast/train_graph.py; train.py --graph): off, on, or both in one run")
    ap.add_argument("--dynamic", action="store_true",
                    help="compile the blocks for dynamic shapes (one kernel for every packed shape)")
    ap.add_argument("--no_hf", action="store_true", help="skip the HF baselines")
    ap.add_argument("--memory_gib", type=float, default=0,
                    help="use at most this much GPU memory (80 on an H200: what fits an H100 80GB)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    if args.tiny:
        args.preset, args.seq_len, args.batch, args.vocab, args.steps, args.warmup = "tiny", 64, 4, 1000, 2, 1
        args.impls, args.loop_steps = "naive,sdpa", 40
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    if args.memory_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_gib * 2**30 / total))
        name += f" (capped at {args.memory_gib:g} GiB)"
    peak = M.peak_flops(device)
    only = set(args.only.split(",")) - {""}
    packs = {"off": (False,), "on": (True,), "both": (False, True)}[args.pack]
    graphs = {"off": (False,), "on": (True,), "both": (False, True)}[args.graph]
    if args.graph != "off" and device.type != "cuda":
        ap.error("--graph needs a CUDA device")
    tok, examples = corpus(args)
    rows, measured = [], {}
    if args.part == "bare":
        measured["matmul_tflops"] = matmul_peak(device) / 1e12
        for impl in args.impls.split(","):
            for obj_name, options, label in RUNS:
                for pack in packs:
                    for graph in graphs:
                        if not only or label in only:
                            attempt(rows, bench_objective, obj_name, impl, options, label, tok, examples, args,
                                    device, pack=pack, graph=graph)
        for compiled in (() if args.no_hf else (False, True)):
            attempt(rows, bench_hf, args, device, len(tok), compiled)
    elif args.part == "loop":
        for obj_name, options, label in RUNS:
            for pack in packs:
                for graph in graphs:
                    if not only or label in only:
                        attempt(rows, bench_loop, obj_name, options, label, args, device, pack=pack, graph=graph)
    else:
        args.preset = "large"
        for batch in (8, 16, 24, 32, 48, 64):
            before = len(rows)
            attempt(rows, bench_objective, "pmlm", args.impls.split(",")[-1], {}, f"pmlm large, batch {batch}",
                    tok, examples, args, device, preset="large", batch=batch)
            if len(rows) == before:                    # out of memory (or broken): the last one that fitted
                break
    print(f"\n{name}, torch {torch.__version__}, preset {args.preset}, batch {args.batch}, text {args.seq_len}, "
          f"vocab {len(tok)}; measured bf16 matmul {measured.get('matmul_tflops', float('nan')):.0f} TFLOP/s; "
          f"MFU against the datasheet peak {(peak or float('nan')) / 1e12:.0f} TFLOP/s")
    table(rows, peak, f"part {args.part}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"bench_{args.part}.json").write_text(json.dumps(
            dict(device=name, torch=torch.__version__, measured=measured, args=vars(args), rows=rows), indent=1))


if __name__ == "__main__":
    main()

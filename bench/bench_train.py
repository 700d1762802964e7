"""Training throughput of every objective on the shared backbone, against HF BertForMaskedLM in the same run.

    python bench/bench_train.py                        # GPU: base preset, seq 512, batch 32, bf16 autocast
    python bench/bench_train.py --tiny                 # CPU smoke run (a small model, a few steps)

For each objective (unilm, pmlm, ernie_gen, palm with and without the copy head) and attention path (naive, sdpa)
it times full training steps (forward, backward, AdamW) on pre-built batches and reports:
  tokens/s      rows the model processes per second (pseudo [P] / [ATTN] rows included), padding excluded
  corpus tok/s  original text tokens per second (what a reader of the corpus gets through)
  MFU           model FLOPs (model.estimate_flops: 6N + 12 l d T + output layer at the predicted rows) / peak bf16
  batch ms      CPU time of objective.make_batch per batch (train.py builds batches in its loop)
HF's BertForMaskedLM (same width/depth/vocab, sdpa attention, all rows through its MLM head) is the baseline; the
"vs HF" column is tokens/s over its tokens/s. Batches are random token ids shaped like real passages: speed does
not depend on which ids they are. Prints a markdown table last; writes bench_train.json to $OUT when set.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M                                    # noqa: E402
from objectives import get_objective                 # noqa: E402
from bench.bench_generate import synthetic_tokenizer  # noqa: E402  (speed depends on the vocabulary's size only)
from tokenizer import SPECIAL_TOKENS as SPECIALS      # noqa: E402


def passages(n, length, vocab_size, rng):
    """n passages of `length` tokens cut into sentences of 8-40 tokens."""
    out = []
    for _ in range(n):
        sents, left = [], length
        while left > 0:
            k = min(left, rng.randint(8, 40))
            sents.append([rng.randrange(len(SPECIALS), vocab_size) for _ in range(k)])
            left -= k
        out.append(sents)
    return out


def timed_steps(step_fn, batches, warmup, device):
    for b in batches[:warmup]:
        step_fn(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = []
    for b in batches[warmup:]:
        t0 = time.perf_counter()
        step_fn(b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_objective(name, impl, args, device, options, label):
    tok = synthetic_tokenizer(args.vocab)
    cls_defaults = get_objective(name, tok, max_len=args.max_position, **options).model_defaults
    cfg = M.ModelConfig(**{**M.PRESETS[args.preset], "vocab_size": args.vocab, "dropout": 0.1,
                           "attn_impl": impl, **cls_defaults})
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(device)
    objective = get_objective(name, tok, max_len=cfg.max_position, **options)
    if hasattr(objective, "set_step"):                      # PALM: time stage 2 (continuation + copy)
        objective.set_step(10 ** 9, 10 ** 9)
    rng = random.Random(0)
    n = args.warmup + args.steps
    raw = [passages(args.batch, args.seq_len - 3, args.vocab, rng) for _ in range(n)]
    t0 = time.perf_counter()
    batches = [objective.make_batch(ex, random.Random(k)) for k, ex in enumerate(raw)]
    make_ms = (time.perf_counter() - t0) / n * 1000
    batches = [b.to(device) for b in batches]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step(b):
        with autocast:
            loss, _ = objective.loss(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sec = timed_steps(step, batches, args.warmup, device)
    b = batches[-1]
    rows = b.n_tokens
    corpus = sum(len(s) for ex in raw[-1] for s in ex) + 3 * args.batch    # text + [SOS] [EOS] [EOS]
    flops = rows * model.estimate_flops(b.input_ids.size(1), int((b.labels != -100).sum()) / rows)
    return dict(label=label, impl=impl, seq=b.input_ids.size(1), tokens_s=rows / sec, corpus_tokens_s=corpus / sec,
                flops_s=flops / sec, step_ms=sec * 1000, batch_ms=make_ms)


def bench_hf(args, device):
    from transformers import BertConfig, BertForMaskedLM
    p = M.PRESETS[args.preset]
    cfg = BertConfig(vocab_size=args.vocab, hidden_size=p["n_embd"], num_hidden_layers=p["n_layer"],
                     num_attention_heads=p["n_head"], intermediate_size=p["ffn_dim"],
                     max_position_embeddings=p["max_position"], attn_implementation="sdpa")
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    L = args.seq_len
    batches = []
    for _ in range(args.warmup + args.steps):
        ids = torch.randint(len(SPECIALS), args.vocab, (args.batch, L), generator=g)
        labels = torch.where(torch.rand(args.batch, L, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        batches.append((ids.to(device), labels.to(device)))

    def step(b):
        with autocast:
            loss = model(input_ids=b[0], attention_mask=torch.ones_like(b[0]), labels=b[1]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sec = timed_steps(step, batches, args.warmup, device)
    n_params = sum(q.numel() for q in model.parameters())
    n_emb = sum(q.numel() for n_, q in model.named_parameters() if "embeddings" in n_) + args.vocab  # + MLM bias
    d, layers = p["n_embd"], p["n_layer"]
    # the same formula as model.estimate_flops; HF sends every row through its MLM head (pred_frac = 1)
    per_token = 6 * (n_params - n_emb) + 12 * layers * d * L + 6 * d * args.vocab
    rows = args.batch * L
    return dict(label="HF BertForMaskedLM", impl="sdpa", seq=L, tokens_s=rows / sec, corpus_tokens_s=rows / sec,
                flops_s=rows * per_token / sec, step_ms=sec * 1000, batch_ms=float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--impls", default="naive,sdpa")
    ap.add_argument("--only", default="", help="comma-separated labels to run (default: all)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    if args.tiny:
        args.preset, args.seq_len, args.batch, args.vocab, args.steps, args.warmup = "tiny", 64, 4, 1000, 2, 1
    args.max_position = M.PRESETS[args.preset]["max_position"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak = M.peak_flops(device)
    runs = [("unilm", {}, "unilm"), ("pmlm", {}, "pmlm"), ("ernie_gen", {}, "ernie_gen"),
            ("palm", {}, "palm (copy)"), ("palm", {"copy": False}, "palm (no copy)")]
    only = set(args.only.split(",")) - {""}
    results = []
    for impl in args.impls.split(","):
        for name, options, label in runs:
            if only and label not in only:
                continue
            try:
                results.append(bench_objective(name, impl, args, device, options, label))
                print(results[-1], flush=True)
            except Exception as e:                      # one broken row must not lose the others
                print(f"{label}/{impl} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    try:
        hf = bench_hf(args, device)
        results.append(hf)
    except Exception as e:
        hf = None
        print(f"HF baseline skipped: {type(e).__name__}: {e}", file=sys.stderr)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"\n{name}, torch {torch.__version__}, preset {args.preset}, batch {args.batch}, text length {args.seq_len}")
    print("| model | attention | rows | tokens/s | corpus tok/s | MFU | step ms | make_batch ms | vs HF |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        mfu = f"{r['flops_s'] / peak:.1%}" if peak else "-"
        vs = f"{r['tokens_s'] / hf['tokens_s']:.2f}x" if hf else "-"
        print(f"| {r['label']} | {r['impl']} | {r['seq']} | {r['tokens_s']:,.0f} | {r['corpus_tokens_s']:,.0f} | {mfu} "
              f"| {r['step_ms']:.1f} | {r['batch_ms']:.1f} | {vs} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_train.json").write_text(json.dumps(dict(device=name, torch=torch.__version__,
                                                                             results=results), indent=1))


if __name__ == "__main__":
    main()

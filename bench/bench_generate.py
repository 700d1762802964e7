"""Decoding speed: generate.py with the KV cache (replayed as CUDA graphs, or eager) vs without it, and Hugging Face
BART-base, same shapes.

Setting: the BASE preset (12 layers, 768 wide, vocab 30522), batch 32, 512-token sources, exactly 64 new tokens
(min_len = max_len = 64), beam 5, trigram blocking. Hugging Face `BartForConditionalGeneration(BartConfig())`
(bart-base's shape: 6 + 6 layers, 768 wide, random weights) decodes the same shapes with num_beams 5,
no_repeat_ngram_size 3, min_new_tokens = max_new_tokens = 64. On CUDA both run with bf16 weights. Each row: one
warm-up call, then the median of --repeats timed calls (torch.cuda.synchronize around each). Random weights are
fine: with [EOS] blocked until the last token, the work per call does not depend on what is generated.
Our rows: "KV cache + whole-step CUDA graph" (what generate.py runs on CUDA: fast.decoding(), the fast layer's
StaticDecoder with fast.beam_search, the model step and the search's bookkeeping of a step in ONE CUDA graph,
fast/beam.py's WholeStep; every call captures its graph, so that cost is in the time), "KV cache + CUDA graph +
device search" (the same with fast.beam.WHOLE_STEP off: the model step alone in a CUDA graph, the bookkeeping
launched kernel by kernel, no host sync a step), "KV cache + CUDA graph" (the model step's graph with generate's
readable beam_search), "KV cache" (generate.READABLE: the readable model.KVCache and search, eager), "no cache"
(recomputation). Without CUDA (--tiny on a CPU) the graph rows are left out (no graph runs there) and "KV cache +
device search" (fast.beam_search on the readable cache) stands in. The model gets fast.speed_up's pieces as
generate.py's command line gives them (on CUDA: Triton's copy scores where triton imports, --copy_scores).

Run:  python bench/bench_generate.py                  # on a GPU; prints a markdown table, writes $OUT/*.json
      python bench/bench_generate.py --tiny           # a seconds-long CPU smoke run of the same code
      python bench/bench_generate.py --profile --no_nocache --no_bart   # where each decoding step's time goes
--rows picks rows (with --profile: `--rows whole,device --profile` shows where a step goes with and without the
whole-step graph).
Left out: quality (random weights), sampling, batch-size sweeps (pass --batch), torch.compile.
"""
import argparse
import functools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fast                                             # noqa: E402
import fast.beam as FB                                  # noqa: E402
import generate as G                                    # noqa: E402
import model as M                                       # noqa: E402
from objectives import get_objective                    # noqa: E402
from tokenizer import SPECIAL_TOKENS, WordPiece         # noqa: E402


def synthetic_tokenizer(vocab_size):
    """A vocabulary of the right size: the specials, ".", then placeholder pieces."""
    words = [f"t{i}" for i in range(vocab_size - len(SPECIAL_TOKENS) - 1)]
    return WordPiece(list(SPECIAL_TOKENS) + ["."] + words)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeats, device):
    """One warm-up call, then the median wall time of `repeats` calls."""
    out = fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


# the rows: (use_cache, cuda_graph, fast_search, whole_step, group_beams) by --rows' names; whole_beam_rows: the
# whole step on one cache row a beam (fast.beam.GROUP_BEAMS off), as before the beams of a source shared one row
ROWS = dict(whole=(True, True, True, True, True), whole_beam_rows=(True, True, True, True, False),
            device=(True, True, True, False, True),
            graph=(True, True, False, False, True), cache=(True, False, False, False, True),
            cache_device=(True, False, True, False, True), nocache=(False, False, False, False, True))


def label(use_cache, cuda_graph, fast_search, whole_step=False, group_beams=True):
    """A row's name: what ran."""
    if not use_cache:
        return "no cache"
    if whole_step and not group_beams:
        return "KV cache + whole-step CUDA graph, one cache row a beam"
    if whole_step:
        return "KV cache + whole-step CUDA graph"
    name = {True: "KV cache + CUDA graph", False: "KV cache"}[cuda_graph]
    return name + " + device search" if fast_search else name


def decoding_of(cuda_graph, fast_search):
    """A row's generate.Decoding: the static decoder replayed as a CUDA graph or the readable one, and the fast
    layer's searches or the readable ones."""
    decoder = functools.partial(fast.StaticDecoder, graphed=True) if cuda_graph else G.Decoder
    searches = (fast.greedy, fast.beam_search) if fast_search else (G.greedy, G.beam_search)
    return G.Decoding(decoder, *searches)


def bench_ours(args, device, dtype, name, use_cache, cuda_graph, fast_search, whole_step, group_beams):
    # fast.beam_search's switch: the whole step in one graph, or the model step's graph alone
    default = FB.WHOLE_STEP, FB.GROUP_BEAMS
    FB.WHOLE_STEP, FB.GROUP_BEAMS = whole_step, group_beams
    try:
        return bench_row(args, device, dtype, name, use_cache, cuda_graph, fast_search, whole_step, group_beams)
    finally:
        FB.WHOLE_STEP, FB.GROUP_BEAMS = default


def bench_row(args, device, dtype, name, use_cache, cuda_graph, fast_search, whole_step, group_beams):
    tok = synthetic_tokenizer(args.vocab)
    obj = get_objective(name, tok, task="seq2seq")
    cfg = dict(M.PRESETS[args.preset], vocab_size=args.vocab, dropout=0.0)
    cfg.update(getattr(obj, "model_defaults", {}))          # palm: the copy head; pmlm: relative position bias
    # the whole source (args.src_len tokens with [SOS]/[EOS]) and every new token must have a position id
    cfg["max_position"] = max(cfg["max_position"], args.src_len + args.new_tokens)
    torch.manual_seed(0)
    model = M.Transformer(M.ModelConfig(**cfg)).to(device=device, dtype=dtype).eval()
    fast.speed_up(model, compile=False, copy_scores=args.copy_scores)   # as generate.py's command line does
    rng = random.Random(0)
    sources = [[rng.randrange(len(SPECIAL_TOKENS) + 1, args.vocab) for _ in range(args.src_len - 2)]
               for _ in range(args.batch)]
    run = lambda: G.generate(model, obj, sources, beam_size=args.beam, max_len=args.new_tokens,
                             min_len=args.new_tokens, no_repeat_ngram=3, use_cache=use_cache, batch_size=args.batch,
                             decoding=decoding_of(cuda_graph, fast_search))
    median, times, out = timed(run, args.repeats, device)
    what = label(use_cache, cuda_graph, fast_search, whole_step, group_beams)
    if args.profile:
        profile_call(run, device, f"{name} ({what})", args.new_tokens)
    lengths = {len(h[0][0]) for h in out}
    assert lengths == {args.new_tokens}, f"expected exactly {args.new_tokens} new tokens, got lengths {lengths}"
    return dict(system=f"unigen {name} ({what})", seconds=median, times=times,
                sentences_per_s=args.batch / median, params=sum(p.numel() for p in model.parameters()))


def profile_call(run, device, title, steps):
    """One more call under torch.profiler: per decoding step, the wall time, the time the GPU is
    busy, and the CPU calls that take the most time (a host sync shows up as aten::item,
    aten::nonzero, aten::_local_scalar_dense or cudaStreamSynchronize)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        run()
        sync(device)
        wall = (time.perf_counter() - t0) / steps * 1000
    events = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / steps / 1000
    print(f"\n### profile, {title}: wall {wall:.2f} ms a step, GPU busy {gpu:.2f} ms a step")
    print("| GPU kernel | calls a step | ms a step |\n|---|---|---|")
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:20]:
        print(f"| {e.key[:80]} | {e.count / steps:.1f} | {e.self_device_time_total / steps / 1000:.3f} |")
    print("| CPU call | calls a step | self CPU ms a step |\n|---|---|---|")
    cpu = [e for e in events if e.device_type.name == "CPU"]
    for e in sorted(cpu, key=lambda e: -e.self_cpu_time_total)[:25]:
        print(f"| {e.key[:80]} | {e.count / steps:.1f} | {e.self_cpu_time_total / steps / 1000:.3f} |")


def bench_bart(args, device, dtype):
    """HF BART with its own generate(); None (row skipped) when transformers is not installed."""
    try:
        from transformers import BartConfig, BartForConditionalGeneration
    except ImportError:
        return None
    cfg = BartConfig() if not args.tiny else BartConfig(
        vocab_size=args.vocab, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)
    torch.manual_seed(0)
    model = BartForConditionalGeneration(cfg).to(device=device, dtype=dtype).eval()
    ids = torch.randint(4, cfg.vocab_size, (args.batch, args.src_len), device=device)       # no special ids
    run = lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=args.beam,
                                 no_repeat_ngram_size=3, min_new_tokens=args.new_tokens,
                                 max_new_tokens=args.new_tokens, length_penalty=1.0, early_stopping=True,
                                 do_sample=False)
    with torch.no_grad():
        median, times, out = timed(run, args.repeats, device)
    new = out.size(1) - 1                                   # minus the decoder start token
    assert new == args.new_tokens, f"BART generated {new} tokens, expected {args.new_tokens}"
    return dict(system="HF BART-base (BartForConditionalGeneration)", seconds=median, times=times,
                sentences_per_s=args.batch / median, params=sum(p.numel() for p in model.parameters()))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="a small CPU smoke run of the same code")
    p.add_argument("--objectives", default="unilm", help="comma list of unilm, pmlm, ernie_gen, palm")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--src_len", type=int, default=512, help="source tokens, [SOS] and [EOS] included")
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--rows", default="all", help=f"comma list of {', '.join(ROWS)} (all: every row that runs "
                   "on this device; the graph rows need CUDA, cache_device stands in for them on a CPU)")
    p.add_argument("--no_bart", action="store_true")
    p.add_argument("--copy_scores", default="auto", choices=("auto", "triton", "compiled"),
                   help="PALM's copy scores on CUDA (fast.speed_up's)")
    p.add_argument("--no_nocache", action="store_true", help="skip the (slow) no-cache rows")
    p.add_argument("--profile", action="store_true", help="profile one more call of each row: where a step goes")
    args = p.parse_args()
    args.preset, args.vocab = "base", 30522
    if args.tiny:
        args.preset, args.vocab, args.batch, args.src_len, args.new_tokens, args.beam, args.repeats = \
            "tiny", 1000, 4, 32, 8, 3, 1
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gpu = device.type == "cuda"
    # every row that runs here: the graph rows where CUDA is (the device search on the readable cache stands in
    # for them on a CPU); the readable cache and search everywhere
    names = ["whole", "whole_beam_rows", "device", "graph"] if gpu else ["cache_device"]
    names += ["cache"] + ([] if args.no_nocache else ["nocache"])
    if args.rows != "all":
        names = args.rows.split(",")
        unknown = [n for n in names if n not in ROWS]
        if unknown:
            p.error(f"--rows: unknown row(s) {', '.join(unknown)}; choose from {', '.join(ROWS)}")
        if not gpu and {"whole", "whole_beam_rows", "device", "graph"} & set(names):
            p.error("--rows: whole, whole_beam_rows, device and graph need a CUDA device (no CUDA graph runs here)")
    print(f"device {torch.cuda.get_device_name(device) if gpu else 'cpu'}, {dtype}, "
          f"preset {args.preset}, batch {args.batch}, source {args.src_len}, new tokens {args.new_tokens}, "
          f"beam {args.beam}, repeats {args.repeats}", flush=True)
    rows = []
    for name in args.objectives.split(","):
        for row in names:
            rows.append(bench_ours(args, device, dtype, name, *ROWS[row]))
            print(rows[-1]["system"], f"{rows[-1]['seconds']:.3f} s", flush=True)
    bart = None if args.no_bart else bench_bart(args, device, dtype)
    if bart is None:
        print("HF BART row skipped (transformers not installed or --no_bart)")
    else:
        rows.append(bart)
    ratios = {}
    for name in args.objectives.split(","):
        mine = {r["system"]: r["sentences_per_s"] for r in rows if f" {name} (" in r["system"]}
        speed = {row: mine.get(f"unigen {name} ({label(*ROWS[row])})") for row in ROWS}
        # each row against the one it improves on, then every cached row against BART-base
        for a, b in (("graph", "cache"), ("device", "graph"), ("whole", "device"), ("whole", "graph"),
                     ("whole", "whole_beam_rows"),
                     ("cache_device", "cache"), ("cache", "nocache")):
            if speed[a] and speed[b]:
                ratios[f"{name}: {label(*ROWS[a])} / {label(*ROWS[b])}"] = speed[a] / speed[b]
        for row in ROWS:
            if bart and speed[row] and row != "nocache":
                ratios[f"{name}: {label(*ROWS[row])} / BART-base"] = speed[row] / bart["sentences_per_s"]
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "bench_generate.json"
        path.write_text(json.dumps(dict(settings=vars(args), device=str(device), rows=rows, ratios=ratios), indent=1))
        print(f"wrote {path}")
    print("\n| system | s / batch | sentences/s |\n| --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['system']} | {r['seconds']:.3f} | {r['sentences_per_s']:.2f} |")
    for k, v in ratios.items():
        print(f"| {k} | | {v:.2f}x |")


if __name__ == "__main__":
    main()

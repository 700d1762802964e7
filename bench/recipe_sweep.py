"""Choose the laptop recipe by measurement: which small model, vocabulary and schedule learn the most in the main
job's budget (5 minutes of 2 CPU cores for pre-training, 10 for pre-training + fine-tuning).

    python bench/recipe_sweep.py dump --out .sweep           # on the laptop: the embedded corpus and task as JSON
    python bench/recipe_sweep.py run --data .sweep --jobs 4  # anywhere (a GPU machine runs many configs at once)

Each config is given its step counts from its CPU budget: steps = seconds x CPU_FLOPS / (FLOPs per step), with
CPU_FLOPS the training FLOP/s measured on the laptop's 2 cores (model.estimate_flops counts them). Accuracy after a
number of steps does not depend on the machine that ran them, so the trajectories can come from a faster machine;
the chosen recipe is then timed end to end on the laptop itself (bench/RESULTS.md). `dump` writes the documents
and pairs of the laptop's Python so that every machine trains on the same text.

For every config: pre-training (pmlm) -> held-out [M] accuracy (acc_ae) beside the unigram baseline (always the
most frequent token); fine-tuning on the docsum task -> beam search on the test split -> ROUGE-L against the lead
baseline (the first 12 words of the source), distinct-2, the share of duplicate outputs and of outputs made only
of function words. Prints a table last; writes sweep.json to $OUT when set.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# training FLOP/s of tiny models on the laptop's 2 cores (measured: 15k tokens/s at 4.0 MFLOP a token)
CPU_FLOPS = 6.0e10
PRETRAIN_S = 260            # of the 5 minutes, after building the vocabulary and the token cache
FINETUNE_S = 240            # of the 10 minutes, after pre-training, exporting and decoding the test split
SCALE = float(os.environ.get("SWEEP_SCALE", "1"))    # < 1: a quick smoke run of the whole pipeline

BASE = dict(pre_obj="pmlm", ft_obj="pmlm", n_layer=2, n_embd=128, n_head=4, ffn_dim=512, vocab_size=8192,
            dropout=0.1, lr=2e-3, seq_len=128, batch_size=32, ft_lr=1e-3, pre_opts={}, ft_opts={})
CONFIGS = {
    "main-job-before": {},                                  # the main job before this sweep
    "lr1e-3": dict(lr=1e-3),
    "lr5e-4": dict(lr=5e-4),
    "lr2e-3-drop0": dict(dropout=0.0),
    "lr2e-3-b16": dict(batch_size=16),
    "lr1e-3-b16-drop0": dict(lr=1e-3, batch_size=16, dropout=0.0),
    "4k-lr1e-3": dict(vocab_size=4096, lr=1e-3),
    "lr1e-3-ftnoise0": dict(lr=1e-3, ft_opts=dict(target_noise_prob=0.0)),
    "lr1e-3-ftlr5e-4": dict(lr=1e-3, ft_lr=5e-4),
    "lr1e-3-ft-palm": dict(lr=1e-3, ft_obj="palm"),
    "palm": dict(pre_obj="palm", ft_obj="palm", lr=1e-3),
    "unilm": dict(pre_obj="unilm", ft_obj="unilm", lr=1e-3),
    "ernie_gen": dict(pre_obj="ernie_gen", ft_obj="ernie_gen", lr=1e-3),
    "lr1e-3-3x128": dict(lr=1e-3, n_layer=3),
}
FUNCTION_WORDS = set("a an the of to in and or is are be for on with as by at it this that from not".split())


def dump(out):
    """The laptop's embedded corpus and task, as JSON other machines read instead of their own stdlib."""
    import data
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache:
        docs = [list(d) for d in data.default_documents(cache)]
        task = data.default_seq2seq(cache)
    (out / "documents.json").write_text(json.dumps(docs))
    (out / "task.json").write_text(json.dumps(task))
    print(f"wrote {len(docs)} documents and {sum(map(len, task.values()))} pairs to {out}")


def use_dumped(folder):
    """Make data.py's embedded corpus and task the dumped ones (the laptop's Python, not this machine's)."""
    import data
    docs = [data.Document(*d) for d in json.loads((Path(folder) / "documents.json").read_text())]
    task = {k: [tuple(p) for p in v] for k, v in json.loads((Path(folder) / "task.json").read_text()).items()}
    data.default_documents = lambda cache_dir=".cache": docs
    data.default_seq2seq = lambda cache_dir=".cache": task


def steps_for(seconds, flops_per_step):
    return max(20, int(seconds * SCALE * CPU_FLOPS / flops_per_step))


def measure_step(cfg, objective_name, task, tok, examples):
    """FLOPs of one training step of this config (one batch through model.estimate_flops)."""
    import random
    import model as M
    from objectives import get_objective
    model = M.Transformer(M.ModelConfig(**{**M.PRESETS["tiny"], "vocab_size": len(tok), "n_layer": cfg["n_layer"],
                                           "n_embd": cfg["n_embd"], "n_head": cfg["n_head"],
                                           "ffn_dim": cfg["ffn_dim"], "rel_pos_buckets": 32}))
    obj = get_objective(objective_name, tok, task=task, max_len=256)
    batch = obj.make_batch(random.Random(0).sample(examples, cfg["batch_size"]), random.Random(0))
    rows = batch.n_tokens
    return rows * model.estimate_flops(batch.input_ids.size(1), int((batch.labels != -100).sum()) / rows)


def unigram_baseline(tok, splits):
    """Held-out accuracy of always predicting the training split's most frequent token at the [M] slots."""
    import random
    from objectives import get_objective
    from objectives.masks import CTX
    counts = Counter(t for p in splits["train"] for s in p for t in s)
    top = counts.most_common(1)[0][0]
    obj = get_objective("pmlm", tok, max_len=256)
    batch = obj.make_batch(splits["valid"], random.Random(0))
    labels = batch.labels[(batch.kind == CTX) & (batch.labels != -100)]
    return float((labels == top).float().mean()), tok.id_to_token(top)


def options(opts):
    return [x for k, v in opts.items() for x in (f"--{k}", str(v).lower())]


def curve(path):
    """(step, split, loss, accuracy) of a run's metrics.jsonl, for the sweep's record."""
    rows = [json.loads(x) for x in open(path)]
    acc = lambda r: next((r[k] for k in ("acc_ae", "acc_mlm", "acc_word", "acc_ar", "acc_par") if k in r), None)
    return [(r["step"], r["split"], round(r.get("loss", float("nan")), 4), acc(r)) for r in rows]


def one(name, data_dir, out, device):
    """Pre-train, fine-tune, decode and score one config; prints one JSON line."""
    use_dumped(data_dir)
    import data
    import evaluate
    import generate
    import train
    cfg = {**BASE, **CONFIGS[name]}
    common = ["--n_layer", cfg["n_layer"], "--n_embd", cfg["n_embd"], "--n_head", cfg["n_head"], "--ffn_dim",
              cfg["ffn_dim"], "--dropout", cfg["dropout"], "--vocab_size", cfg["vocab_size"], "--device", device,
              "--cache_dir", f"{out}/cache", "--progress", "false", "--batch_size", cfg["batch_size"],
              "--workers", "0", "--compile", "false"]
    common = [str(a) for a in common]
    tok, splits, _ = data.prepare_pretrain(None, cfg["vocab_size"], f"{out}/cache", max_tokens=cfg["seq_len"] - 3,
                                           progress=False)
    pre_steps = steps_for(PRETRAIN_S, measure_step(cfg, cfg["pre_obj"], "pretrain", tok, splits["train"]))
    pairs = data.prepare_seq2seq(None, tok, f"{out}/cache", progress=False)
    ft_steps = steps_for(FINETUNE_S, measure_step(cfg, cfg["ft_obj"], "seq2seq", tok, pairs["train"]))
    t0 = time.time()
    train.main(common + ["--objective", cfg["pre_obj"], "--out_dir", f"{out}/pre", "--max_steps", str(pre_steps),
                         "--lr", str(cfg["lr"]), "--seq_len", str(cfg["seq_len"]), "--eval_interval",
                         str(max(1, pre_steps // 4)), "--eval_batches", "100", "--log_interval", "50"]
               + options(cfg["pre_opts"]))
    t1 = time.time()
    valid = [json.loads(x) for x in open(f"{out}/pre/metrics.jsonl") if '"valid"' in x][-1]
    train.main(common + ["--objective", cfg["ft_obj"], "--task", "seq2seq", "--init_from", f"{out}/pre/ckpt.pt",
                         "--out_dir", f"{out}/fine", "--max_steps", str(ft_steps), "--lr", str(cfg["ft_lr"]),
                         "--eval_interval", str(max(1, ft_steps // 4)), "--eval_batches", "10", "--log_interval",
                         "50"] + options(cfg["ft_opts"]))
    t2 = time.time()
    model, tok2, objective = generate.load_checkpoint(f"{out}/fine/ckpt.pt", device)
    task = data.default_seq2seq()
    sources = [s for s, _ in task["test"]]
    refs = [" ".join(t.split()) for _, t in task["test"]]
    hyps = generate.generate_text(model, tok2, objective, sources, beam_size=5, max_len=32)
    scores = evaluate.rouge(hyps, refs, stem=True)
    lead = evaluate.rouge(evaluate.lead(sources, 12), refs, stem=True)
    base_acc, base_tok = unigram_baseline(tok, splits)
    only_function = sum(all(w in FUNCTION_WORDS for w in h.lower().strip(".").split()) for h in hyps)
    row = dict(name=name, **cfg, pretrain_steps=pre_steps, finetune_steps=ft_steps,
               acc=next(valid[k] for k in ("acc_ae", "acc_mlm", "acc_word", "acc_ar") if k in valid),
               valid=valid, unigram_acc=base_acc, unigram_token=base_tok,
               rougeL=100 * scores["rougeL"]["fmeasure"], lead_rougeL=100 * lead["rougeL"]["fmeasure"],
               distinct2=evaluate.distinct_n(hyps, 2), duplicates=1 - len(set(hyps)) / len(hyps),
               function_only=only_function / len(hyps), examples=hyps[:5],
               pre_curve=curve(f"{out}/pre/metrics.jsonl"), ft_curve=curve(f"{out}/fine/metrics.jsonl"),
               seconds_here=dict(pretrain=t1 - t0, finetune=t2 - t1))
    print("RESULT " + json.dumps(row), flush=True)


def run(data_dir, jobs, device, only):
    names = [n for n in CONFIGS if not only or n in only]
    procs, rows = {}, []
    pending = list(names)
    while pending or procs:
        while pending and len(procs) < jobs:
            name = pending.pop(0)
            out = tempfile.mkdtemp(prefix=f"sweep-{name}-")
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // jobs))}
            procs[name] = subprocess.Popen([sys.executable, __file__, "one", "--name", name, "--data", data_dir,
                                            "--out", out, "--device", device], cwd=ROOT, env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1)
        for name, p in list(procs.items()):
            if p.poll() is not None:
                output = p.stdout.read()
                result = [line for line in output.splitlines() if line.startswith("RESULT ")]
                if result:
                    rows.append(json.loads(result[-1][7:]))
                    print(f"{name}: done", flush=True)
                else:
                    print(f"{name} failed:\n{output[-3000:]}", flush=True)
                del procs[name]
    print("\n| config | pre steps | held-out acc | unigram | ft steps | ROUGE-L | lead | distinct-2 | dup | func-only |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["acc"]):
        print(f"| {r['name']} | {r['pretrain_steps']} | {r['acc']:.3f} | {r['unigram_acc']:.3f} | "
              f"{r['finetune_steps']} | {r['rougeL']:.1f} | {r['lead_rougeL']:.1f} | {r['distinct2']:.2f} | "
              f"{r['duplicates']:.2f} | {r['function_only']:.2f} |")
    for r in rows:
        print(r["name"], r["examples"][:3])
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep.json").write_text(json.dumps(rows, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["dump", "run", "one"])
    ap.add_argument("--out", default=".sweep")
    ap.add_argument("--data", default=".sweep")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--device", default="cuda" if "CUDA_VISIBLE_DEVICES" in os.environ or _has_cuda() else "cpu")
    ap.add_argument("--name", default="")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    if args.command == "dump":
        dump(args.out)
    elif args.command == "one":
        one(args.name, args.data, args.out, args.device)
    else:
        run(args.data, args.jobs, args.device, set(args.only.split(",")) - {""})


def _has_cuda():
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    main()

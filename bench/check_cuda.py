"""On a GPU, every piece of the fast layer (fast/) must still equal its readable twin (CPU tests see only forward
passes of FlexAttention and SDPA's math backend, and no CUDA graph).

    python bench/check_cuda.py
    python bench/check_cuda.py triton      # only the Triton kernels' checks (bench/check_triton.py)
    python bench/check_cuda.py graph       # only the training step replayed as a CUDA graph (fast/train_graph.py,
                                           # train.py --graph; its tokenizer cache: $CACHE, else .cache)
    python bench/check_cuda.py fp16        # only train.py --dtype fp16 with its loss scaler against fp32
    python bench/check_cuda.py loop        # only: train.py's steps between logs never wait for the GPU
                                           # (its tokenizer cache: $CACHE, else .cache)
    TORCH_SHOW_CPP_STACKTRACES=1 python bench/check_cuda.py loop error unilm   # where a step waits, if one does

For every objective's real pre-training batch (base preset shapes, random weights, dropout 0):
  - the final hidden states of SDPA (cuDNN / efficient kernels) and FlexAttention (fast.describe_flex: block mask from
    kind/step, the relative bias as a score_mod) against the naive path, in fp32 and under bf16 autocast, as
    ||a - b|| / ||b||;
  - the gradients of every parameter of the same loss, flex and sdpa against naive (fp32), with fast.speed_up's
    BucketBias on the sdpa path;
  - the model with compiled blocks (fast.speed_up, train.py's default on CUDA) against the eager one;
  - packed rows (fast.plan_packing / fast.Packed, train.py --pack true) against one passage a row:
    the gradients of the same loss on a batch of passages of mixed lengths, sdpa and flex (fp32);
and PALM's compiled copy scores (fast.compiled_additive_scores) against model.additive_scores (values and gradients),
fast.BucketBias against RelativePositionBias.lookup, beam decoding with the readable KV cache against recomputation
(tokens identical), and decoding with fast.StaticDecoder replayed as a CUDA graph against the readable cache (greedy and
beam 3 and 5, tokens identical, scores close), also with an [EOS] bias that makes sources finish at different steps
(the readable search's graph then gives way to the eager static step), with the readable search, the fast search on
the model step's graph and the whole-step graph search (fast/beam.py); the whole-step graph search against the
model step's graph under bf16 autocast (generate.py's setting on CUDA, every hypothesis of beam 5), one cache row a
source (fast.beam.GROUP_BEAMS) equal to one row a beam in fp32 and as close to fp32 under bf16 autocast;
train.py --dtype fp16 (fp16 with torch's loss scaler) against fp32 and its skipped steps; the training step replayed
as a CUDA graph (fast/train_graph.py) against the eager one, train.py --graph true against --graph false, and its
gradients averaged over processes against DDP's hooks; and
fast/triton_bias.py's Triton attention and fast/triton_additive.py's Triton copy scores (bench/check_triton.py at base
size; the copy scores also against model.additive_scores as the compiled ones). `loop`
(not an equality, so not in the default run) checks that train.py's steps between two logs never wait for the GPU
(torch.cuda.set_sync_debug_mode, every objective); `loop error [OBJECTIVE...]` stops each run at the first call
that waits and prints its traceback. Prints a table; exits non-zero if a check fails. Without CUDA it exits with
one line saying so (status 2).
"""
import contextlib
import os
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fast                                                    # noqa: E402
import fast.beam as FB                                         # noqa: E402
import model as M                                              # noqa: E402
from bench.bench_generate import decoding_of, synthetic_tokenizer  # noqa: E402
from bench.bench_train import passages                        # noqa: E402
from generate import generate, gnmt_penalty, score_targets    # noqa: E402
from objectives import get_objective                           # noqa: E402
from objectives.masks import PAD                               # noqa: E402


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def hidden(model, batch, impl, dtype):
    model.config.attn_impl = impl
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        return model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)[batch.kind != PAD]


def grads(model, objective, batch, impl):
    model.config.attn_impl = impl
    model.zero_grad(set_to_none=True)
    loss, _ = objective.loss(model, batch)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def check_objective(name, tok, dev, rows):
    obj = get_objective(name, tok, max_len=512)
    obj.set_step(10, 10)
    cfg = M.ModelConfig(**{**M.PRESETS["base"], "vocab_size": len(tok), "dropout": 0.0, **obj.model_defaults})
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(dev).eval()
    batch = obj.make_batch(passages(8, 509, len(tok), random.Random(0)), random.Random(0)).to(dev)
    ok = True
    for dtype, limit in ((torch.float32, 1e-3), (torch.bfloat16, 2e-2)):   # tf32 / bf16 arithmetic
        ref = hidden(model, batch, "naive", dtype)
        for impl in ("sdpa", "flex"):
            err = rel(hidden(model, batch, impl, dtype), ref)
            ok &= err < limit
            rows.append((name, f"{impl} vs naive, hidden, {str(dtype)[6:]}", f"{err:.2e}", err < limit))
    ref = grads(model, obj, batch, "naive")
    # the readable path was the reference; train.py's pieces from here on
    fast.speed_up(model, compile=False)
    for impl in ("sdpa", "flex"):
        err = rel(grads(model, obj, batch, impl), ref)
        ok &= err < 1e-3
        rows.append((name, f"{impl} vs naive, gradients, fp32", f"{err:.2e}", err < 1e-3))
    ok &= check_packing(model, obj, tok, dev, rows, name)
    eager = hidden(model, batch, "flex", torch.bfloat16)
    fast.speed_up(model, compile=True)
    err = rel(hidden(model, batch, "flex", torch.bfloat16), eager)
    ok &= err < 2e-2
    rows.append((name, "compiled blocks vs eager (flex, bf16)", f"{err:.2e}", err < 2e-2))
    model = M.Transformer(cfg).to(dev).eval()
    obj_s2s = get_objective(name, tok, task="seq2seq", max_len=512)
    sources = [s[0] for s in passages(4, 100, len(tok), random.Random(1))]
    with torch.no_grad():
        a = generate(model, obj_s2s, sources, beam_size=3, max_len=16)
        b = generate(model, obj_s2s, sources, beam_size=3, max_len=16, use_cache=False)
    same = [x[0][0] for x in a] == [x[0][0] for x in b]
    rows.append((name, "beam 3: cache vs no cache (fp32)", "tokens equal" if same else "tokens differ", same))
    return ok and same and check_graph(name, model, obj_s2s, sources, rows)


def check_train_graph(name, tok, dev, rows):
    """fast/train_graph.py's GraphedLoss (the step's forward, loss and backward replayed as a CUDA graph at a steady
    padded shape) against LossModule's eager forward and backward: the loss and every gradient on three batches of
    mixed lengths (the steady shape grows, so graphs are captured anew and replayed), one passage a row and packed
    (fast.SteadyPacking, as train.py --pack), base size, compiled blocks as train.py runs them. fp32: against the
    unpadded batch one passage a row (1e-4: what proves the graph, the padding and the packing exact); bf16: against
    the eager step on the same padded batch (1e-2, as the other bf16 rows; 6e-08 to 1.6e-03 on an H200,
    2026-11-28), and the unpadded one for scale."""
    import train
    from fast import train_graph
    obj = get_objective(name, tok, max_len=512)
    obj.set_step(10, 10)
    obj.pad_multiple = 64
    cfg = M.ModelConfig(**{**M.PRESETS["base"], "vocab_size": len(tok), "dropout": 0.0, **obj.model_defaults})
    ok = True
    for dtype, pack in ((torch.float32, False), (torch.bfloat16, False), (torch.float32, True),
                        (torch.bfloat16, True)):
        torch.manual_seed(0)
        model = fast.speed_up(M.Transformer(cfg).to(dev), compile=True, dynamic=True)
        module = train.LossModule(model, obj, fast.packed)
        graphed = train_graph.GraphedLoss(module, tok.pad_id, dtype)
        packing = fast.SteadyPacking(64)
        params = list(model.parameters())

        def eager(batch):
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()              # in place: the graphs hold these tensors
            with torch.autocast("cuda", dtype, enabled=dtype != torch.float32):
                loss, _ = module(batch)
            loss.backward()
            return loss.detach().float(), torch.cat([p.grad.flatten() for p in params])
        rng = random.Random(3)
        for k in range(3):
            mixed = [p[:rng.randint(1, len(p))] for p in passages(16, 509, len(tok), rng)]
            batch = obj.make_batch(mixed, random.Random(k)).to(dev)
            want_loss, want = eager(batch)
            if pack:
                batch = packing(obj.make_batch(mixed, random.Random(k))).to(dev)
            key = graphed.shapes.fit(batch)
            padded_loss, padded = eager(train_graph.pad_batch(batch, key, tok.pad_id))
            for p in params:
                p.grad.zero_()
            loss, _ = graphed(batch)
            got = torch.cat([p.grad.flatten() for p in params])
            if dtype == torch.float32:
                err, limit, what = max(rel(loss, want_loss), rel(got, want)), 1e-4, "unpadded eager step"
            else:
                err, limit, what = max(rel(loss, padded_loss), rel(got, padded)), 1e-2, "eager step, same shape"
            ok &= err < limit
            shape = (f"{len(batch)} x {batch.input_ids.size(1)} in {key.rows} x {key.width}" if not pack else
                     "packed {} x {} in {} x {}".format(*batch.extras["pack_shape"], *key.packed[:2]))
            rows.append((name, f"training step as a CUDA graph vs the {what}, batch {k + 1} ({shape}; "
                         f"{len(graphed.graphs)} graph(s)), loss and gradients, {str(dtype)[6:]}",
                         f"{err:.2e} (unpadded: {rel(got, want):.2e})", err < limit))
    return ok


# train.py as the checks of its own settings run it: small preset, dropout 0, no evaluation or checkpoint midway
TRAIN_FLAGS = ["--preset", "small", "--seq_len", "128", "--batch_size", "16", "--eval_interval", "1000",
               "--ckpt_interval", "1000", "--dropout", "0", "--progress", "false", "--vocab_size", "30522",
               "--cache_dir", os.environ.get("CACHE", ".cache")]


def train_run(*flags):
    """train.py with TRAIN_FLAGS and these in a folder of its own -> (its training records, its final weights)."""
    import json
    import tempfile
    import train
    with tempfile.TemporaryDirectory() as out:
        train.main(TRAIN_FLAGS + ["--out_dir", out, *flags])
        log = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        ckpt = torch.load(Path(out) / "ckpt.pt", weights_only=True, map_location="cpu")
    return [r for r in log if r["split"] == "train"], ckpt["model"]


def check_train_loop_graph(rows, steps=12):
    """train.py --graph true against --graph false from the same weights on the same batches (small preset, dropout
    0, fp32, --grad_accum 2, compiled blocks; one passage a row and --pack true): every step's loss within 1e-4 and
    the final weights within 1e-4 (relative norm, per tensor), which holds the graph's gradient scale (1 /
    grad_accum), its gradients kept across micro-batches and zeroed in place after the optimizer step."""
    ok = True
    for name in ("unilm", "pmlm"):
        for pack in ("false", "true"):
            (eager_log, eager_w), (graph_log, graph_w) = (
                train_run("--objective", name, "--pack", pack, "--graph", graph, "--grad_accum", "2", "--max_steps",
                          str(steps), "--log_interval", "1", "--dtype", "fp32") for graph in ("false", "true"))
            eager_loss, graph_loss = ([r["loss"] for r in log] for log in (eager_log, graph_log))
            loss_err = max(abs(a - b) / abs(b) for a, b in zip(graph_loss, eager_loss))
            w_err = max(rel(graph_w[k], eager_w[k]) for k in eager_w)
            good = len(graph_loss) == len(eager_loss) == steps and max(loss_err, w_err) < 1e-4
            ok &= good
            rows.append((name, f"train.py --graph true vs false, {steps} steps of 2 micro-batches, --pack {pack} "
                         "(fp32): losses, final weights", f"{loss_err:.2e}, {w_err:.2e}", good))
    return ok


def ddp_graph_worker(rank, port, out, steps=4):
    """One of check_ddp_graph's two processes (gloo, both on cuda:0): the same training steps through DDP's hooks
    (LossModule wrapped in DDP, eager) and through fast.GraphedLoss and its all_reduce (what train.py --graph true
    runs under torchrun), from the same weights on this rank's own batches, plain SGD (AdamW would magnify
    rounding: its first step moves every weight by lr, whatever the gradient's size); rank 0 saves each step's
    averaged gradients of both."""
    import torch.distributed as dist
    import train
    from fast import train_graph
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dev = torch.device("cuda:0")
    tok = synthetic_tokenizer(30522)
    obj = get_objective("unilm", tok, max_len=128)
    cfg = M.ModelConfig(**{**M.PRESETS["small"], "vocab_size": len(tok), "dropout": 0.0, **obj.model_defaults})
    grads = {}
    for mode in ("ddp", "graph"):
        torch.manual_seed(0)
        model = M.Transformer(cfg).to(dev)
        module = train.LossModule(model, obj)
        ddp = torch.nn.parallel.DistributedDataParallel(module, device_ids=[dev]) if mode == "ddp" else None
        graphed = None if ddp else train_graph.GraphedLoss(module, tok.pad_id, torch.float32, grad_scale=1 / 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        grads[mode] = []
        for step in range(steps):
            for micro in range(2):
                rng = random.Random(1000 * rank + 10 * step + micro)
                batch = obj.make_batch(passages(8, 125, len(tok), rng), rng).to(dev)
                if ddp is None:
                    graphed(batch)
                    continue
                with ddp.no_sync() if micro == 0 else contextlib.nullcontext():
                    (ddp(batch)[0] / 2).backward()
            if ddp is None:
                graphed.all_reduce()
            grads[mode].append(torch.cat([p.grad.flatten() for p in model.parameters()]).cpu())
            opt.step()
            opt.zero_grad(set_to_none=ddp is not None)
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


def check_ddp_graph(rows):
    """train.py --graph true under torchrun: no DDP wrapper, fast.GraphedLoss's gradients averaged by its all_reduce
    after the micro-batches. Against DDP's own hooks on the same batches (2 processes sharing one GPU over gloo, small
    preset, fp32, dropout 0, 4 SGD steps of 2 micro-batches, each rank its own batches): every step's averaged
    gradients within 1e-5."""
    import socket
    import tempfile
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "grads.pt"
        torch.multiprocessing.spawn(ddp_graph_worker, args=(port, str(out)), nprocs=2)
        grads = torch.load(out, weights_only=True)
    err = max(rel(g, d) for g, d in zip(grads["graph"], grads["ddp"]))
    rows.append(("unilm", "GraphedLoss + all_reduce vs DDP's hooks, 2 processes (gloo), 4 SGD steps of 2 "
                 "micro-batches (fp32): each step's averaged gradients", f"{err:.2e}", err < 1e-5))
    return err < 1e-5


def check_packing(model, obj, tok, dev, rows, name):
    """train.py --pack: 16 passages of mixed lengths packed several to a row (rows of width fast.pack_width)
    against the same batch one passage a row: the gradients of every parameter of the objective's loss."""
    rng = random.Random(2)
    mixed = [p[:rng.randint(1, len(p))] for p in passages(16, 509, len(tok), rng)]
    batch = fast.plan_packing(obj.make_batch(mixed, random.Random(2)), 64, fast.key_cost(model)).to(dev)
    ok = True
    for impl in ("sdpa", "flex"):
        model.config.attn_impl = impl
        want = grads(model, obj, batch, impl)
        model.zero_grad(set_to_none=True)
        obj.loss(fast.packed(model, batch), batch)[0].backward()
        got = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        err = rel(got, want)
        ok &= err < 1e-3
        shape = batch.extras["pack_shape"]
        rows.append((name, f"packed ({len(batch)} passages in {shape[0]} rows of {shape[1]}) vs one a row, "
                           f"gradients, {impl}, fp32", f"{err:.2e}", err < 1e-3))
    return ok


def check_decoding(name, tok, dev, rows):
    """check_objective's decoding part alone (`python bench/check_cuda.py decode`): the base model, random
    weights, fp32, the CUDA-graph searches against the readable cache."""
    cfg = M.ModelConfig(**{**M.PRESETS["base"], "vocab_size": len(tok), "dropout": 0.0,
                           **get_objective(name, tok, max_len=512).model_defaults})
    torch.manual_seed(0)
    model = M.Transformer(cfg).to(dev).eval()
    obj_s2s = get_objective(name, tok, task="seq2seq", max_len=512)
    sources = [s[0] for s in passages(4, 100, len(tok), random.Random(1))]
    return check_graph(name, model, obj_s2s, sources, rows)


def check_graph(name, model, obj, sources, rows):
    """Decoding with fast.StaticDecoder replayed as a CUDA graph against the readable KV cache (generate.READABLE):
    the same tokens and scores within 1e-4, greedy, beam 3 and beam 5; [EOS] bias 2 (the LM bias starts at 0) makes
    sources finish at different steps. With the readable search rows leave the batch and the graph gives way to the
    eager static step; with the fast layer's search (fast.beam_search, fast.decoding()'s) rows stay and the graph
    serves to the end: the whole step in one graph (fast/beam.py's WholeStep and StepGraph, fast.beam.WHOLE_STEP, the
    default), or the model step's graph with the bookkeeping launched kernel by kernel (WHOLE_STEP off)."""
    ok = True
    eos = obj.tok.eos_id
    searches = (("readable search", False, True), ("model-step graph + fast search", True, False),
                ("whole-step graph search", True, True))
    for bias in (0.0, 2.0):
        with torch.no_grad():
            model.lm_bias[eos] = bias
            for beam in (1, 3, 5):
                eager = generate(model, obj, sources, beam_size=beam, max_len=16)
                for search, on_device, whole in searches:
                    default = FB.WHOLE_STEP
                    FB.WHOLE_STEP = whole
                    try:
                        graphed = generate(model, obj, sources, beam_size=beam, max_len=16,
                                           decoding=decoding_of(True, on_device))
                    finally:
                        FB.WHOLE_STEP = default
                    same = [h[0][0] for h in eager] == [h[0][0] for h in graphed]
                    err = max(abs(e[0][1] - g[0][1]) for e, g in zip(eager, graphed))
                    lengths = [len(h[0][0]) for h in graphed]
                    good = same and err < 1e-4
                    ok &= good
                    rows.append((name, f"beam {beam}, [EOS] bias {bias:g}: {search} vs readable "
                                 f"cache (fp32)", f"tokens {'equal' if same else 'differ'}, score error {err:.1e}, "
                                 f"lengths {lengths}", good))
            model.lm_bias[eos] = 0.0
    # run whatever the checks above gave
    return check_whole_step_bf16(name, model, obj, sources, rows) and ok


def beam5_hypotheses(model, obj, sources, whole, group, autocast=True):
    """Every hypothesis of beam 5 (32 tokens) on the CUDA graph, under bf16 autocast as generate.py runs on CUDA
    (autocast False: fp32); whole: fast.beam.WHOLE_STEP, group: fast.beam.GROUP_BEAMS."""
    default = FB.WHOLE_STEP, FB.GROUP_BEAMS
    FB.WHOLE_STEP, FB.GROUP_BEAMS = whole, group
    try:
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            return generate(model, obj, sources, beam_size=5, n_best=5, max_len=32, decoding=fast.decoding())
    finally:
        FB.WHOLE_STEP, FB.GROUP_BEAMS = default


def hypotheses_error(a, b):
    """Whether every hypothesis of a and b has the same tokens, and the largest score difference."""
    same = [[ids for ids, _ in h] for h in a] == [[ids for ids, _ in h] for h in b]
    return same, max(abs(x[1] - y[1]) for ha, hb in zip(a, b) for x, y in zip(ha, hb))


def rescored_error(model, obj, sources, hyps, max_len=32, alpha=1.0):
    """The largest |score - the readable decoder's score of the same tokens| over every hypothesis (fp32): each
    hypothesis teacher-forced through generate.score_targets, [EOS] included unless max_len cut it, its log-probs
    summed and divided by the same GNMT penalty."""
    eos = obj.tok.eos_id
    srcs, targets, scores = [], [], []
    for src, h in zip(sources, hyps):
        for ids, score in h:
            srcs.append(src)
            targets.append(list(ids) + ([eos] if len(ids) < max_len else []))
            scores.append(score)
    with torch.no_grad():
        logps = score_targets(model, obj, srcs, targets)
    return max(abs(float(lp.sum()) / gnmt_penalty(len(t), alpha) - s) for lp, t, s in zip(logps, targets, scores))


def check_whole_step_bf16(name, model, obj, sources, rows):
    """The whole-step graph search against the model step's graph with the bookkeeping kernel by kernel
    (fast.beam.WHOLE_STEP off), under bf16 autocast, both on one cache row a beam (fast.beam.GROUP_BEAMS off): they
    run the same kernels on the same numbers (embed, blocks, log-softmax; the bans only write -inf and the reorders
    copy), so every hypothesis must be identical and the scores equal. Then the default, one cache row a source
    (GROUP_BEAMS), whose attention has other shapes: in fp32 it must give one row a beam's hypotheses, every one, and
    their scores within 1e-4 (what its bookkeeping could get wrong); under bf16 autocast its rounding differs, so a
    long search may take another path: over 16 sources its best hypotheses' scores must lie as close to fp32's, on
    average, as one row a beam's do (within 2x)."""
    whole, model_step = (beam5_hypotheses(model, obj, sources, w, group=False) for w in (True, False))
    same, err = hypotheses_error(whole, model_step)
    good = same and err < 1e-5
    rows.append((name, "beam 5, all hypotheses: whole-step graph vs model-step graph search, one cache row a beam "
                 "(bf16 autocast)", f"tokens {'equal' if same else 'differ'}, score error {err:.1e}", good))
    fp32 = {group: beam5_hypotheses(model, obj, sources, True, group, autocast=False) for group in (False, True)}
    same, err = hypotheses_error(fp32[True], fp32[False])
    # where two hypotheses score within rounding of each other, the two layouts may keep either: what must hold is
    # that every hypothesis one cache row a source returns has the score the readable decoder gives its tokens
    rescore = max(rescored_error(model, obj, sources, out) for out in fp32.values())
    exact = (same and err < 1e-4) or rescore < 1e-4
    rows.append((name, "beam 5, all hypotheses: one cache row a source vs one row a beam (fp32); each hypothesis's "
                 "score vs the readable decoder's teacher-forced score of its tokens",
                 f"tokens {'equal' if same else 'differ'}, score error {err:.1e}; rescored {rescore:.1e}", exact))
    more = sources * 4
    best = lambda out: torch.tensor([h[0][1] for h in out])
    fp32 = best(beam5_hypotheses(model, obj, more, True, group=False, autocast=False))
    rows_err, grouped_err = ((best(beam5_hypotheses(model, obj, more, True, group)) - fp32).abs().mean().item()
                             for group in (False, True))
    close = grouped_err <= 2 * rows_err + 1e-3
    rows.append((name, f"beam 5, best hypotheses of {len(more)} sources, mean |score - fp32's| (bf16 autocast): one "
                 "cache row a source vs one row a beam", f"{grouped_err:.1e} vs {rows_err:.1e}", close))
    return good and exact and close


def copy_scores_error(dev, scores):
    """The largest relative error of scores(hm, ws, w) against model.additive_scores at (8, 400/100, 768), fp32:
    the values and the gradients of hm, ws and w."""
    g = torch.Generator(device=dev).manual_seed(0)
    hm, ws, w = (torch.randn(*shape, device=dev, generator=g, requires_grad=True)
                 for shape in ((8, 400, 768), (8, 100, 768), (768,)))
    outs = []
    for fn in (M.additive_scores, scores):
        for x in (hm, ws, w):
            x.grad = None
        e = fn(hm, ws, w)
        (e * torch.linspace(-1, 1, e.numel(), device=dev).view_as(e)).sum().backward()
        outs.append([e.detach()] + [x.grad.clone() for x in (hm, ws, w)])
    return max(rel(a, b) for a, b in zip(outs[1], outs[0]))


def check_copy_scores(dev, rows):
    """PALM's Eq. 3 scores: the compiled fused kernel (fast.compiled_additive_scores) against the written-out
    (B, T, S, d) version (model.additive_scores)."""
    err = copy_scores_error(dev, fast.compiled_additive_scores())
    rows.append(("palm", "copy scores: compiled vs eager, values and gradients", f"{err:.2e}", err < 1e-4))
    return err < 1e-4


def check_triton_copy_scores(dev, rows):
    """PALM's Eq. 3 scores by fast/triton_additive.py (Triton: tiles of scores) against model.additive_scores:
    bench/check_triton.py's additive checks (values and the gradients of hm, ws, w against float64, fp32 and bf16
    hm/ws as in training; large |x|; the palm model's loss and gradients) at small shapes and the base shape (B 8,
    T 100, S 400, d 768), and the same comparison as check_copy_scores (fp32 against the eager function)."""
    try:
        from bench import check_triton
        from fast import triton_additive as TA
    except ImportError as e:
        rows.append(("palm", "triton copy scores", f"not importable: {e}", False))
        return False
    found, ok = check_triton.check_additive(dev, base=True)
    rows.extend((f"triton copy scores: {label}", what, value, good)
                for label, what, value, good in found)
    err = copy_scores_error(dev, TA.additive_scores)
    rows.append(("palm", "copy scores: triton vs eager, values and gradients", f"{err:.2e}", err < 1e-4))
    return ok and err < 1e-4


def check_fp16_scaler(rows, objective="unilm", steps=12):
    """train.py --dtype fp16 (fp16 autocast, torch's loss scaler, the fused AdamW) against --dtype fp32 from the same
    weights on the same batches (small preset, dropout 0), in both block layouts: every step's loss finite and within
    2% of fp32's, the scaler stepping (at most a few steps skipped while it finds its scale), the final weights within
    5e-2 of fp32's (relative norm, per tensor). Then a scale of 2^40, which overflows every fp16 gradient: each step
    is skipped on the device (the weights stay the initial ones), the scale halves each time, the log counts them."""
    import functools
    import train

    def run(*more):
        return train_run("--objective", objective, "--compile", "false", *more)

    ok = True
    for layout, post_ln in (("pre-LN", "false"), ("post-LN", "true")):
        (l32, w32), (l16, w16) = (run("--max_steps", str(steps), "--log_interval", "1", "--post_ln", post_ln,
                                      "--dtype", dtype) for dtype in ("fp32", "fp16"))
        finite = all(torch.isfinite(torch.tensor(r["loss"])) for r in l16)
        loss_err = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(l16, l32))
        weight_err = max(rel(w16[k], w32[k]) for k in w32 if w32[k].norm() > 0)
        skipped = sum(r["skipped_steps"] for r in l16)
        good = finite and loss_err < 2e-2 and weight_err < 5e-2 and skipped < steps // 2
        ok &= good
        rows.append((objective, f"fp16 + loss scaler vs fp32, {layout}, {steps} steps: loss (max) / weights (max "
                                f"per tensor) / steps skipped", f"{loss_err:.2e} / {weight_err:.2e} / {skipped}", good))
    # every gradient overflowing: the steps skipped on the device
    initial = {}
    make, scaler = train.make_optimizer, torch.amp.GradScaler
    train.make_optimizer = lambda model, *a: initial.update(
        {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}) or make(model, *a)
    torch.amp.GradScaler = functools.partial(scaler, init_scale=2.0 ** 40)
    try:
        (record,), weights = run("--max_steps", "3", "--log_interval", "3", "--dtype", "fp16")
    finally:
        train.make_optimizer, torch.amp.GradScaler = make, scaler
    same = all(torch.equal(weights[k], initial[k]) for k in initial)
    good = same and record["skipped_steps"] == 3 and record["loss_scale"] == 2.0 ** 37
    rows.append((objective, "fp16, every gradient overflowing (scale 2^40): steps skipped / scale / weights kept",
                 f"{record['skipped_steps']} / {record['loss_scale']:g} / {same}", good))
    return ok and good


def check_bucket_bias(dev, rows):
    """UniLMv2's relative bias on the GPU (fast.BucketBias: one-hot products in the backward) against the plain
    index_select lookup (RelativePositionBias.lookup): the bias exactly, the table's gradient within 1e-4 (fp32 and bf16 gradients)."""
    rel_bias = M.RelativePositionBias(32, 128, 12, 512).to(dev)
    pos = torch.cat([torch.arange(512), torch.arange(192) % 100 + 30]).to(dev).expand(16, 704)
    buckets = rel_bias.buckets(pos, pos)
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.randn(16, 12, 704, 704, device=dev).to(dtype)
        w = rel_bias.table.weight
        plain = rel_bias.lookup(buckets).to(dtype)
        want, = torch.autograd.grad(plain, w, g)
        bucketed = fast.BucketBias.apply(w, buckets, dtype)
        got, = torch.autograd.grad(bucketed, w, g)
        err = rel(got, want)
        same = torch.equal(bucketed, plain)
        good = same and err < 1e-4
        ok &= good
        rows.append(("pmlm", f"relative bias: BucketBias vs index_select, gradient from {str(dtype)[6:]}",
                     f"bias {'equal' if same else 'differs'}, gradient {err:.2e}", good))
    return ok


def check_triton_bias(dev, rows):
    """fast/triton_bias.py (Triton: the relative bias and the mask rule inside the tiles) against the readable
    path: bench/check_triton.py's checks at small and base size, values and gradients (q, k, v, the bias table),
    fp32 and bf16, tile skipping, and the pmlm model through fast.use_triton_bias (compiled blocks too)."""
    try:
        from bench import check_triton
        from fast import triton_bias                                     # noqa: F401
    except ImportError as e:
        rows.append(("pmlm", "triton attention", f"not importable: {e}", False))
        return False
    found, ok = check_triton.check(dev, base=True)
    rows.extend((f"triton: {label}", what, value, good) for label, what, value, good in found)
    return ok


def main():
    # `python bench/check_cuda.py triton`: only the Triton kernels' checks; `... decode`: only decoding's;
    # `... loop`: only the audit of train.py's steps
    only_triton = sys.argv[1:] == ["triton"]
    only_decode = sys.argv[1:] == ["decode"]
    only_graph = sys.argv[1:] == ["graph"]
    only_fp16 = sys.argv[1:] == ["fp16"]
    only_loop = sys.argv[1:2] == ["loop"]
    # `... loop error OBJECTIVE...`: stop at the first call that waits and print where it came from
    loop_mode = "error" if sys.argv[2:3] == ["error"] else "warn"
    loop_names = [a for a in sys.argv[2:] if a != "error"] or ("unilm", "pmlm", "ernie_gen", "palm")
    if only_fp16 and torch.cuda.is_available():
        rows = []
        return report(rows, check_fp16_scaler(rows))
    if not torch.cuda.is_available():
        print("check_cuda.py: error: this check needs a CUDA GPU (none here); the CPU-runnable twins are "
              "tests/test_fast.py, tests/test_fast_beam.py, tests/test_fast_graph_search.py and "
              "tests/test_attention_paths.py", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda")
    tok = synthetic_tokenizer(30522)
    rows, ok = [], True
    if only_loop:
        for name in loop_names:
            try:
                ok &= check_loop_syncs(name, rows, mode=loop_mode)
            except Exception as e:                   # report, and go on with the other objectives
                ok = False
                rows.append((name, "loop check crashed", f"{type(e).__name__}: {str(e)[:300]}", False))
        return report(rows, ok)
    checks = [check_decoding] if only_decode else [check_train_graph] if only_graph else [check_objective,
                                                                                          check_train_graph]
    for name in () if only_triton else ("unilm", "pmlm", "ernie_gen", "palm"):
        for check in checks:
            try:
                ok &= check(name, tok, dev, rows)
            except Exception as e:                   # report, and go on with the other checks
                ok = False
                rows.append((name, f"{check.__name__} crashed", f"{type(e).__name__}: {str(e)[:300]}", False))
            torch.cuda.empty_cache()
    if only_decode:
        return report(rows, ok)
    for check in (check_ddp_graph, check_train_loop_graph):
        try:
            ok &= check(rows)
        except Exception as e:                       # report, and go on
            ok = False
            rows.append(("unilm", f"{check.__name__} crashed", f"{type(e).__name__}: {str(e)[:300]}", False))
    if only_graph:
        return report(rows, ok)
    if not only_triton:
        ok &= check_copy_scores(dev, rows)
        ok &= check_bucket_bias(dev, rows)
        try:
            ok &= check_fp16_scaler(rows)
        except Exception as e:                       # report, and go on
            ok = False
            rows.append(("unilm", "fp16 + loss scaler crashed", f"{type(e).__name__}: {str(e)[:300]}", False))
    try:
        ok &= check_triton_bias(dev, rows)
    except Exception as e:                           # report, and print the table
        ok = False
        rows.append(("pmlm", "triton attention crashed", f"{type(e).__name__}: {str(e)[:300]}", False))
    try:
        ok &= check_triton_copy_scores(dev, rows)
    except Exception as e:                           # report, and print the table
        ok = False
        rows.append(("palm", "triton copy scores crashed", f"{type(e).__name__}: {str(e)[:300]}", False))
    report(rows, ok)


def is_wait(message):
    """Whether a warning of torch.cuda.set_sync_debug_mode("warn") reports a call that waited for the GPU: its
    notice that the mode is a prototype, given once when it is first switched on, is not one."""
    return "called a synchronizing cuda operation" in str(message).lower()


def check_loop_syncs(name, rows, steps=range(3, 9), mode="warn"):
    """train.py's steps between two logs never wait for the GPU (the loop checks the loss and logs every
    log_interval steps, and syncs only there): torch.cuda.set_sync_debug_mode("warn") over `steps` of a
    short run (after the compilation), and the warnings of a synchronizing call counted, with their lines.
    mode "error": the first such call raises, and its traceback (Python, and C++ where
    TORCH_SHOW_CPP_STACKTRACES=1) is printed: where a warning cannot say which call waited."""
    import tempfile
    import traceback
    import warnings
    import train
    step_fn, seen = train.train_step, []

    def audited(run, autocast):
        if run.step not in steps:
            return step_fn(run, autocast)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(mode)
            try:
                return step_fn(run, autocast)
            except RuntimeError as e:
                if mode == "error" and is_wait(e):
                    print(f"--- {name}, step {run.step + 1}: the call that waited ---\n{traceback.format_exc()}")
                    last = traceback.extract_tb(e.__traceback__)[-1]
                    seen.append(warnings.WarningMessage(str(e), RuntimeWarning, last.filename, last.lineno))
                    raise _Stop() from e
                raise
            finally:
                torch.cuda.set_sync_debug_mode("default")
                seen.extend(caught)
    train.train_step = audited
    try:
        with tempfile.TemporaryDirectory() as out, contextlib.suppress(_Stop):
            train.main(["--objective", name, "--preset", "small", "--seq_len", "128", "--batch_size", "16",
                        "--max_steps", str(max(steps) + 3), "--log_interval", "100", "--eval_interval", "1000",
                        "--ckpt_interval", "1000", "--out_dir", out, "--progress", "false",
                        "--vocab_size", "30522", "--cache_dir", os.environ.get("CACHE", ".cache")])
    finally:
        train.train_step = step_fn
    syncs = [w for w in seen if is_wait(w.message)]
    for w in syncs:
        # what the warning says, not only where Python was when it arrived
        print(f"--- {name}: {w.filename}:{w.lineno}: {str(w.message)[:2000]}")
    where = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})
    rows.append((name, f"train.py's steps {min(steps)}-{max(steps)}: calls that wait for the GPU",
                 f"{len(syncs)}" + (f" ({', '.join(where[:6])})" if where else ""), not syncs))
    return not syncs


class _Stop(Exception):
    """check_loop_syncs's mode "error": the first call that waited ends the run."""


def report(rows, ok):
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| objective | check | result | |\n|---|---|---|---|")
    for name, what, value, good in rows:
        print(f"| {name} | {what} | {value} | {'ok' if good else 'FAIL'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

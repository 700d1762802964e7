"""The GPU speed layer (fast/) equals the readable code it stands in for, wherever a piece can run on a CPU:
BucketBias against RelativePositionBias.lookup (values, gradients, float64 gradcheck), the speed_up switch, and the
static-shape decoder (fast.StaticDecoder, whose step a CUDA graph replays) against the readable KV cache and against
recomputation: the same tokens and scores for all four objectives, greedy and beam, while rows leave the batch.
FlexAttention is held to the naive path in tests/test_attention_paths.py (forward: it has no backward on a CPU);
compiled blocks, the compiled copy scores and real CUDA graphs only in bench/check_cuda.py on a GPU."""
import pytest
import torch

import fast
import generate as G
import model as M
from objectives import get_objective
from tests.helpers import tiny_model
# one_thread: test_generate's autouse fixture (tiny tensors run faster on one intra-op thread)
from tests.test_generate import EOS, NAMES, TOK, make_model, one_thread, sources  # noqa: F401


# --- the relative bias ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [12, 70])          # 70 rows: chunks of 2 query rows in the backward
def test_bucket_bias_equals_plain_lookup(L):
    """The GPU's lookup (fast.BucketBias: one-hot products in the backward) gives the plain index_select's bias and
    table gradient; run here on a CPU, in float64, with reused positions as UniLMv2 has them."""
    torch.manual_seed(0)
    rel = M.RelativePositionBias(32, 128, 3, 512).double()
    pos = torch.cat([torch.arange(L - 4), torch.tensor([1, 2, 2, 5])]).expand(2, L)
    plain = rel(pos, pos)                                           # the readable path: index_select
    g = torch.randn_like(plain)
    plain.backward(g)
    want = rel.table.weight.grad.clone()
    rel.table.weight.grad = None
    buckets = rel.buckets(pos, pos)
    bucketed = fast.BucketBias.apply(rel.table.weight, buckets, torch.float64)
    bucketed.backward(g)
    assert bucketed.is_contiguous()
    torch.testing.assert_close(bucketed, plain, rtol=0, atol=0)
    torch.testing.assert_close(rel.table.weight.grad, want, rtol=1e-12, atol=1e-12)
    if L < 20:                                   # gradcheck: one backward per output number
        assert torch.autograd.gradcheck(lambda t: fast.BucketBias.apply(t, buckets, torch.float64),
                                        (rel.table.weight.detach().clone().requires_grad_(),))


def test_speed_up_keeps_the_readable_path_on_a_cpu():
    """fast.speed_up without compile changes nothing on a CPU: the readable bias and copy scores stay."""
    model = tiny_model(40, rel_pos_buckets=32, copy_head=True)
    assert fast.speed_up(model, compile=False) is model
    assert model.rel_bias.fast_lookup is None and model.copy_head.fast_scores is None


def fake_triton_additive(monkeypatch, module):
    """fast/triton_additive.py as `from fast import triton_additive` will find it: `module`, or None
    for a machine where it does not import (no triton)."""
    import sys
    monkeypatch.setitem(sys.modules, "fast.triton_additive", module)
    if module is None:
        monkeypatch.delattr(fast, "triton_additive", raising=False)
    else:
        monkeypatch.setattr(fast, "triton_additive", module, raising=False)


def test_fast_copy_scores_picks_triton_for_training_rows_and_compiled_for_decoding(monkeypatch):
    """speed_up's copy scores on CUDA ("auto"): Triton's tiles where a full tile of target rows is there
    (training: 1.23x a PALM step on an H200), the compiled function for fewer (decoding's one row a beam,
    where the tiles were slower); "compiled" and "triton" force one; a typo is one clear error. Both
    functions are fakes here (they need a GPU or Triton's slow interpreter; bench/check_cuda.py holds
    both equal to model.additive_scores)."""
    import types
    calls = []
    rows = 32
    module = types.SimpleNamespace(FORWARD=(rows, 32, 16, 8),
                                   additive_scores=lambda hm, ws, w: calls.append("triton"))
    fake_triton_additive(monkeypatch, module)
    monkeypatch.setattr(fast, "compiled_additive_scores", lambda: lambda hm, ws, w: calls.append("compiled"))
    hm, w = torch.zeros(2, 9, 4), torch.zeros(4)
    scores = fast.fast_copy_scores()
    for T in (1, 5, rows - 1, rows, 3 * rows + 1):
        scores(hm, torch.zeros(2, T, 4), w)
    assert calls == ["compiled"] * 3 + ["triton"] * 2
    calls.clear()
    fast.fast_copy_scores("compiled")(hm, torch.zeros(2, 100, 4), w)
    fast.fast_copy_scores("triton")(hm, torch.zeros(2, 1, 4), w)
    assert calls == ["compiled", "triton"]
    with pytest.raises(ValueError, match="copy_scores 'fused': auto, triton or compiled"):
        fast.fast_copy_scores("fused")
    # a GPU older than compute capability 8.0 (a T4: 7.5) keeps the compiled function unless asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    calls.clear()
    fast.fast_copy_scores()(hm, torch.zeros(2, 3 * rows, 4), w)
    fast.fast_copy_scores("triton")(hm, torch.zeros(2, 3 * rows, 4), w)
    assert calls == ["compiled", "triton"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    calls.clear()
    fast.fast_copy_scores()(hm, torch.zeros(2, 3 * rows, 4), w)
    assert calls == ["triton"]


def test_fast_copy_scores_without_triton_is_the_compiled_function(monkeypatch):
    """Where triton does not import, "auto" falls back to the compiled function; "triton" fails there."""
    fake_triton_additive(monkeypatch, None)
    compiled = object()
    monkeypatch.setattr(fast, "compiled_additive_scores", lambda: compiled)
    assert fast.fast_copy_scores() is compiled
    with pytest.raises(ImportError):
        fast.fast_copy_scores("triton")


def test_graph_true_refuses_fp16_in_one_line():
    """train.py --graph true: fp16's loss scaler runs outside a CUDA graph, so fp16 is refused (checked before the
    card is asked anything); on a CPU --graph true is refused (tests/test_train.py), auto is off."""
    import train
    from utils import UsageError
    for device, dtype, words in (("cuda", "fp16", "fp16's loss scaler runs outside a CUDA graph"),
                                 ("cpu", "fp32", "it needs a CUDA device")):
        with pytest.raises(UsageError, match=words):
            train.check_fast_flags(train.TrainConfig(graph="true"), "sdpa", torch.device(device), dtype)
    _, _, graph = train.use_fast_layer(tiny_model(40), get_objective("unilm", TOK), train.TrainConfig(graph="auto"),
                                       torch.device("cpu"), "fp32")
    assert graph is False


def test_a_card_too_old_for_a_fast_flag_is_refused_in_one_line(monkeypatch):
    """train.py on a card of compute capability 7.5 (model.FAST_PIECES): --attn_impl flex (8.0) is refused, and on
    6.0 --compile true (7.0) is; --compile auto is not. No card is needed: the capability is all that is asked."""
    import train
    from utils import UsageError
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    with pytest.raises(UsageError, match=r"--attn_impl flex needs a card of compute capability 8.0 or more"):
        train.check_fast_flags(train.TrainConfig(), "flex", cuda, "fp32")
    train.check_fast_flags(train.TrainConfig(compile="true"), "sdpa", cuda, "fp32")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 0))
    with pytest.raises(UsageError, match=r"--compile true: torch.compile's Triton kernels need compute capability 7.0"):
        train.check_fast_flags(train.TrainConfig(compile="true"), "sdpa", cuda, "fp32")
    train.check_fast_flags(train.TrainConfig(compile="auto"), "sdpa", cuda, "fp32")


def test_compiled_blocks_compile_once_for_every_shape_train_py_feeds_them(monkeypatch):
    """train.py compiles the blocks for any shape (dynamic=True): the count of rows changes with packing and
    with the examples an objective skips, and compiling once per shape ran the study's ERNIE-GEN pre-training
    4x slower (bench/RESULTS.md, the study). One graph serves every (rows, width), with the eager
    block's values (gradients: bench/check_cuda.py)."""
    import train
    from torch._dynamo.utils import counters
    seen = {}
    monkeypatch.setattr(fast, "speed_up", lambda model, **kw: seen.update(kw))
    train.use_fast_layer(tiny_model(40), get_objective("unilm", TOK), train.TrainConfig(compile="true"),
                         torch.device("cpu"), "fp32")
    assert seen == {"compile": True, "dynamic": True}
    # dynamo's graphs and guards as train.py's compile makes them; the eager backend skips code generation
    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend="eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    model = tiny_model(40)
    eager = model.blocks[0]
    compiled = fast.compile_blocks(tiny_model(40), dynamic=True).blocks[0]
    compiled.load_state_dict(eager.state_dict())
    for rows, width in [(5, 16), (6, 16), (3, 24)]:
        x = torch.randn(rows, width, model.config.n_embd)
        mask = torch.rand(rows, width, width) < 0.7
        mask |= torch.eye(width, dtype=torch.bool)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, mask), eager(x, mask), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_compiled_block_stays_one_graph_under_ddp(monkeypatch, tmp_path):
    """Under DDP, dynamo's DDPOptimizer would cut each compiled block at DDP's gradient buckets (a base block was
    two graphs: under torchrun train.py ran at 0.87 of one GPU alone, bench/RESULTS.md, DDP).
    compile_blocks turns it off: with buckets far smaller than a block, the block's forward is still one graph
    handed to the compiler, and its gradients are the eager block's."""
    import torch.distributed as dist
    compiled_graphs = []

    def counting_backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward
    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend=counting_backend, **kw))
    torch._dynamo.reset()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    # dynamo's default, as train.py meets it; config.patch puts back what compile_blocks sets after the test
    # (monkeypatch's undo would hide the entry from torch's config module)
    try:
        with torch._dynamo.config.patch(optimize_ddp=True):
            # a block of 0.8M fp32 weights (3.2 MB) and buckets of 1 MB (the DDPOptimizer's smallest): four of them
            wide = dict(n_layer=1, n_embd=256, ffn_dim=1024)
            eager = tiny_model(40, **wide).blocks[0]
            block = fast.compile_blocks(tiny_model(40, **wide), dynamic=True).blocks[0]
            ddp = torch.nn.parallel.DistributedDataParallel(block, bucket_cap_mb=1)
            x = torch.randn(3, 16, 256)
            mask = torch.rand(3, 16, 16) < 0.7
            mask |= torch.eye(16, dtype=torch.bool)
            ddp(x, mask).square().sum().backward()
        eager(x, mask).square().sum().backward()
        assert len(compiled_graphs) == 1
        for (name, p), q in zip(block.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()


def test_model_with_bucket_bias_equals_readable_model():
    """The switch model.py reads (RelativePositionBias.fast_lookup, set by speed_up on a GPU), forced here on a CPU:
    the whole model's output and every gradient equal the readable lookup's (float64)."""
    torch.manual_seed(0)
    model = tiny_model(40, rel_pos_buckets=32).double()
    B, L = 2, 16
    ids = torch.randint(0, 40, (B, L))
    pos = torch.cat([torch.arange(12), torch.tensor([3, 4, 4, 9])]).expand(B, L)
    seg = torch.zeros_like(ids)
    mask = torch.rand(B, L, L, generator=torch.Generator().manual_seed(1)) < 0.6
    outs, grads = [], []
    for lookup in (None, fast.BucketBias.apply):
        model.rel_bias.fast_lookup = lookup
        model.zero_grad()
        h = model(ids, pos, seg, mask)
        h.pow(2).sum().backward()
        outs.append(h)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


# --- static shapes (the step a CUDA graph replays) == the readable cache == recomputation ---------------------------

# an [EOS] logit bias per objective that makes the sources below finish at different steps (rows leave the batch)
EOS_BIAS = dict(unilm=3.0, pmlm=1.5, ernie_gen=1.5, palm=3.5)


def finishing(name):
    """(model, objective, sources) whose sources finish at different steps, greedy and beam 3, max_len 10."""
    model, obj = make_model(name), get_objective(name, TOK, task="seq2seq", max_len=64)
    with torch.no_grad():
        model.lm_bias[EOS] += EOS_BIAS[name]
    return model, obj, sources((0, 3, 9, 14, 5, 11), seed=4)


def assert_same_hypotheses(a, b):
    assert [[ids for ids, _ in h] for h in a] == [[ids for ids, _ in h] for h in b]
    for ha, hb in zip(a, b):
        assert [s for _, s in ha] == pytest.approx([s for _, s in hb], abs=1e-5)


# the fast layer's decoding run eagerly: what generate.py runs on CUDA, without the graph (none runs on a CPU)
EAGER = fast.decoding(graphed=False)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_static_step_equals_readable_cache_and_no_cache(name, beam, monkeypatch):
    """fast.StaticDecoder decodes exactly as the readable KV cache and as recomputation, while rows leave the batch
    at different steps (the readable searches on it)."""
    model, obj, srcs = finishing(name)
    kw = dict(beam_size=beam, n_best=beam, max_len=10, batch_size=len(srcs))
    readable = G.generate(model, obj, srcs, **kw)
    full = G.generate(model, obj, srcs, use_cache=False, **kw)
    rows = []                                                          # the rows of every static step
    logprobs = fast.StaticDecoder.logprobs
    monkeypatch.setattr(fast.StaticDecoder, "logprobs", lambda self: rows.append(len(self.tgt)) or logprobs(self))
    static = G.generate(model, obj, srcs, decoding=G.Decoding(EAGER.decoder, G.greedy, G.beam_search), **kw)
    assert len(set(rows)) >= 3                                         # rows left at two different steps at least
    assert_same_hypotheses(static, readable)
    assert_same_hypotheses(static, full)


@pytest.mark.parametrize("name", NAMES)
def test_teacher_forced_scores_static_equals_readable_cache(name, monkeypatch):
    """score_targets: the static step's per-step log-probs are the readable cache's (and so recomputation's:
    tests/test_generate.py)."""
    model, obj = make_model(name), get_objective(name, TOK, task="seq2seq", max_len=64)
    srcs, tgts = sources(), sources((5, 1, 7, 3), seed=1)
    readable = G.score_targets(model, obj, srcs, tgts)
    static = G.score_targets(model, obj, srcs, tgts, decoder=EAGER.decoder)
    for a, b in zip(static, readable):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


class EagerGraph:
    """Stands in for fast.decoder.GraphedStep on a CPU: the same static input buffers and output copy, fn run where the graph
    would replay. Every call must bring the shapes it was captured with (what a real graph needs)."""
    captures = []

    def __init__(self, fn, *inputs):
        self.fn, self.inputs = fn, [x.clone() for x in inputs]
        EagerGraph.captures.append(self)

    def __call__(self, *inputs):
        assert [x.shape for x in inputs] == [x.shape for x in self.inputs]
        for static, x in zip(self.inputs, inputs):
            static.copy_(x)
        return self.fn(*self.inputs).clone()


@pytest.mark.parametrize("name", NAMES)
def test_graph_bookkeeping(name, monkeypatch):
    """The static step's CUDA graph logic with EagerGraph in place of the graph: captured once at the second step,
    replayed with static shapes while the rows stay, then dropped for the eager step when sources finish; the same
    hypotheses as the readable decoder throughout. Every mask the static step gives the model is
    (N, n_new, capacity) with no dead row (encode's eye padding never applies)."""
    model, obj, srcs = finishing(name)
    monkeypatch.setattr(fast.decoder, "GraphedStep", EagerGraph)
    masks = []
    encode = model.encode

    def spy(x, pos, mask, cache=None):
        assert mask.any(-1).all()
        masks.append(mask.shape)
        return encode(x, pos, mask, cache)
    for beam, min_len in ((1, 1), (3, 1), (3, 10)):                  # min_len = max_len: no source finishes early
        rules = G.decoding_rules(TOK, min_len, 3, None, "cpu")
        readable = G.Decoder(model, obj, srcs, 10)
        want = G.beam_search(readable, beam, 10, 1.0, rules) if beam > 1 else G.greedy(readable, 10, 1.0, rules)
        EagerGraph.captures.clear()
        masks.clear()
        monkeypatch.setattr(model, "encode", spy)
        dec = fast.StaticDecoder(model, obj, srcs, 10)
        dec.graphed = True                                             # what generate.py's door asks for on CUDA
        got = G.beam_search(dec, beam, 10, 1.0, rules) if beam > 1 else G.greedy(dec, 10, 1.0, rules)
        monkeypatch.setattr(model, "encode", encode)
        assert_same_hypotheses(got, want)
        assert len(EagerGraph.captures) == 1
        # sources that finish early drop the graph for the eager step; else it serves to the end
        assert dec.graph is None and not dec.graphed if min_len == 1 else dec.graph is EagerGraph.captures[0]
        assert {m[-1] for m in masks} == {dec.cache.capacity}          # the source pass and every step
        if min_len == 10:                                              # static shapes from the second step on
            assert len(set(masks[2:])) == 1 and len(masks) == 11


def test_the_loop_audit_counts_a_call_that_waits_not_the_prototype_notice():
    """bench/check_cuda.py loop counts the warnings torch.cuda.set_sync_debug_mode("warn") gives for a call that waits
    for the GPU; torch's notice that the mode is a prototype (its first switch) is not one (the texts of torch 2.11)."""
    from bench.check_cuda import is_wait
    assert is_wait("called a synchronizing CUDA operation (Triggered internally at "
                   "/pytorch/c10/cuda/CUDAFunctions.cpp:162.)")
    assert is_wait(RuntimeError("called a synchronizing CUDA operation"))
    assert not is_wait("Synchronization debug mode is a prototype feature and does not yet detect all "
                       "synchronizing operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")


def test_grouped_cache_lets_each_beam_see_its_own_history_only():
    """fast.StaticCache on one row a source (group_beams, the whole-step beam search's layout on CUDA): after random
    beam reorders, the target slots a beam's query sees (up to this step) are exactly its history's, one a step, in the
    columns its ancestors wrote them, and its own new slot; every source slot stays visible; no key moves."""
    B, K, S, T, H, D = 2, 3, 4, 6, 1, 2
    cache = fast.StaticCache(1, S + T, S, "cpu")
    pos = torch.arange(S).expand(B, S)
    cache.key_positions(pos)
    cache.layer(0, torch.randn(B, H, S, D), torch.randn(B, H, S, D))       # the source's pass
    cache.commit(S)
    cache.group_beams(K)
    keys = cache.k[0].clone()
    g = torch.Generator().manual_seed(0)
    history = [[[] for _ in range(K)] for _ in range(B)]                    # (column, step) slots of each beam
    for t in range(T - 1):
        slots = cache.new_slots(1)                                           # each beam's new column (K,)
        assert slots.tolist() == [S + k * T + t for k in range(K)]
        sees = cache.sees(slots)                                             # (B, K, S + K T)
        for b in range(B):
            for k in range(K):
                assert sees[b, k, :S].all()
                seen = {(int(j - S) // T, int(j - S) % T) for j in sees[b, k, S:].nonzero().flatten() + S
                        if (j - S) % T <= t}
                assert seen == set(history[b][k]) | {(k, t)}
        # this step's tokens join the cache, then each beam continues a random beam of its source
        cache.fill += 1
        parent = torch.randint(0, K, (B, K), generator=g)
        history = [[history[b][int(parent[b, k])] + [(int(parent[b, k]), t)] for k in range(K)] for b in range(B)]
        cache.reorder((torch.arange(B)[:, None] * K + parent).flatten(), same_sources=True, static=True)
        assert torch.equal(cache.k[0], keys)                                 # nothing moved


# --- the training step at a steady static shape (what fast/train_graph.py captures as a CUDA graph) -------------


@pytest.mark.parametrize("pack", [False, True], ids=["one a row", "packed"])
@pytest.mark.parametrize("name", ["unilm", "pmlm", "ernie_gen", "palm"])
def test_a_batch_padded_to_the_steady_shape_trains_as_itself(name, pack, tok, passages):
    """fast.train_graph pads every batch to one steady shape (a padding row, a wider row, labelled counts rounded
    up; packed: wider packed rows, token counts rounded up): the loss, every metric and every parameter's gradient
    are the unpadded batch's, one passage a row (float64, the readable path; the CUDA graph itself:
    bench/check_cuda.py graph)."""
    import random
    import train
    from fast import train_graph
    from tests.test_packing import model_for
    obj = get_objective(name, tok, max_len=128)
    obj.set_step(10 ** 9, 10 ** 9)                                 # PALM: stage 2, continuation + copy
    model = model_for(name, tok, "sdpa")
    module = train.LossModule(model, obj, fast.packed)
    shapes = train_graph.StaticShapes(multiple=64)
    packing = fast.SteadyPacking(multiple=64)             # the width StaticShapes keeps: the free slot is its own
    for k in range(3):
        rng = random.Random(k)
        mixed = [p[:rng.randint(1, len(p))] for p in rng.sample(passages["train"], 6)]
        batch = obj.make_batch(mixed, random.Random(k))
        shown = packing(obj.make_batch(mixed, random.Random(k))) if pack else batch
        shape = shapes.fit(shown)
        padded = train_graph.pad_batch(shown, shape, tok.pad_id)
        assert len(padded) == 7 and padded.input_ids.size(1) % 64 == 0 and padded.input_ids.size(1) >= batch.input_ids.size(1)
        assert all(padded.labelled(kind) > batch.labelled(kind) for kind in batch.n_labels)
        if pack:
            rows, width = shown.extras["pack_shape"]
            assert padded.extras["pack_shape"] == shape.packed[:2] and shape.packed[0] == rows
            assert shape.packed[1] >= width and padded.extras["pack_tokens"].numel() == shape.packed[2]
        runs = []
        for b in (batch, padded):
            model.zero_grad(set_to_none=True)
            loss, metrics = module(b)
            loss.backward()
            runs.append((loss, metrics, [p.grad.clone() for p in model.parameters()]))
        (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = runs
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=1e-12)
        for key_name, value in metrics_a.items():
            torch.testing.assert_close(torch.as_tensor(metrics_b[key_name]).double(),
                                       torch.as_tensor(value).double(), rtol=1e-12, atol=1e-12, msg=key_name)
        for ga, gb in zip(grads_a, grads_b):
            torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-12)


def test_the_spare_token_indices_of_a_packing_land_in_a_free_slot():
    """pad_packing: a token index a slot of the packed rows, the spare ones sending the batch's last token, padding,
    to a slot no real token takes: the packing's own free slot, or the last slot where the rows widened; a full
    packing has none spare. StaticShapes keeps the packing's count of rows."""
    from fast import train_graph
    from objectives import Batch
    # 3 passages of 4 tokens in rows of width 4 (batch 3 x 4): full rows, no free slot, nothing spare
    ids = torch.zeros(3, 4, dtype=torch.long)
    full = dict(pack_tokens=torch.arange(12), pack_slots=torch.arange(12), pack_shape=(3, 4), pack_free=None)
    shape = train_graph.StaticShapes(multiple=4).fit(Batch(ids, ids, ids, ids, ids + 1, ids, full, {}))
    assert shape.packed == (3, 4, 12)
    assert torch.equal(train_graph.pad_packing(full, 4, shape)["pack_slots"], torch.arange(12))
    # one slot free, the last of row 1 (slots 0-6 and 8-11 taken); then the same rows widened to 8
    taken = torch.tensor([0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11])
    packing = dict(pack_tokens=torch.arange(11), pack_slots=taken, pack_shape=(3, 4), pack_free=7)
    for packed, free in (((3, 4, 12), 7), ((3, 8, 24), 23)):
        extras = train_graph.pad_packing(packing, 4, train_graph.Shape(4, 4, (), packed))
        real, spare = extras["pack_slots"][:11], extras["pack_slots"][11:]
        assert spare.numel() == packed[2] - 11 and (spare == free).all() and free not in real
        assert (extras["pack_tokens"][11:] == 15).all()                  # the padded batch's last token


def test_steady_shapes_only_grow_and_key_the_graphs(tok, passages):
    """StaticShapes: rows = the most seen + 1, width and labelled counts the most seen rounded up (to the multiple,
    to 8 times it); a smaller batch keeps the shape (and so its graph); the key also holds the batch's Python extras
    (UniLM's LM type: a graph of its own)."""
    import random
    from fast import train_graph
    obj = get_objective("unilm", tok, max_len=128)
    shapes = train_graph.StaticShapes(multiple=64)
    big = obj.make_batch(random.Random(0).sample(passages["train"], 8), random.Random(0))
    small = obj.make_batch(random.Random(1).sample(passages["train"], 3), random.Random(1))
    first = shapes.fit(big)
    assert first.rows == 9 and first.width % 64 == 0 and all(n % 512 == 0 for _, n in first.counts)
    assert first.packed is None
    assert shapes.fit(small) == first
    keys = {train_graph.extras_key(obj.make_batch(passages["train"][:4], random.Random(k))) for k in range(12)}
    assert len(keys) >= 2 and all(dict(k)["lm_type"] in range(4) for k in keys)

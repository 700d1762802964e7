"""The fast layer: everything in unigen that exists only for GPU speed, ABOVE the teaching files.

Read model.py and generate.py first: they hold the papers' rules, the naive and SDPA attention,
the readable relative bias, the readable KV cache and beam search. This package holds the GPU
machinery that computes the same numbers faster (custom autograd functions, FlexAttention block
masks and score_mods, a static-shape cache replayed as a CUDA graph, compile helpers). It imports
the teaching files and fills the hooks they leave; none of them imports it.

The rule: every piece here equals a readable function of the teaching files, named in its
docstring with the test that holds the two equal on a CPU; bench/check_cuda.py holds them equal on
a GPU, values and gradients, at base size.

Importing fast registers FlexAttention as model.py's attn_impl "flex" (ATTENTION, DESCRIBED). The
doors that switch the rest on (on a CPU the readable path is the default everywhere):
    train.use_fast_layer        speed_up (BucketBias, Triton or compiled copy scores, compiled
                                blocks), --pack's packing (fast/packing.py) and --graph's
                                GraphedLoss (fast/train_graph.py)
    generate.decoding_for       decoding on CUDA: decoding(), StaticDecoder replayed as a CUDA graph
                                and fast/beam.py's searches on the device
    use_triton_bias(model)      fast/triton_bias.py's Triton kernel on the flex path
    use_triton_additive(model)  PALM's copy scores by fast/triton_additive.py (Triton)
Objectives, notebooks and exercises never import it.

Pieces, their readable twins and the tests that hold them equal:
    BucketBias                 RelativePositionBias.lookup          tests/test_fast.py
    FlexBias, mask_mod         RelativePositionBias, attention_mask tests/test_attention_paths.py
    describe_flex, flex        Transformer.encode, naive_attention  tests/test_attention_paths.py
    compiled_additive_scores   model.additive_scores                bench/check_cuda.py (GPU only)
    compile_blocks             the eager blocks                     bench/check_cuda.py (GPU only)
    plan_packing, Packed       the model on one passage a row       tests/test_packing.py
    StaticCache, StaticDecoder model.KVCache, generate.Decoder      tests/test_fast.py
    GraphedStep                the eager StaticDecoder.step         tests/test_fast.py, check_cuda
    beam_search, greedy        generate.beam_search, greedy         tests/test_fast_beam.py
                               (fast/beam.py: no host sync a step)
    WholeStep, StepGraph,      generate.beam_search, greedy,        tests/test_fast_graph_search.py,
    static_ban                 ban_tokens (the whole step in one    check_cuda
                               CUDA graph)
    GraphedLoss, pad_batch     LossModule's forward and backward,   tests/test_fast.py (padding,
                               DDP's all-reduce (fast/train_graph:  packing), check_cuda graph
                               a CUDA graph a steady shape, packed
                               or not; train.py --graph true)
    use_triton_bias            Transformer.encode, naive_attention  bench/check_triton.py (CPU: the
                               (fast/triton_bias.py)                interpreter), check_cuda
    use_triton_additive        model.additive_scores                bench/check_triton.py (CPU: the
                               (fast/triton_additive.py)            interpreter), check_cuda
The measurements behind each piece are in bench/RESULTS.md. fast/triton_bias.py and
fast/triton_additive.py need triton (not a requirement of the project).
Left out: fused optimizers, FP8, paged caches.
"""
import functools

import torch

import generate as G
import model as M
from fast import beam
from fast.attention import (BucketBias, FlexBias, block_mask, describe_flex, flex,  # noqa: F401
                            mask_mod)
from fast.beam import beam_search, greedy  # noqa: F401
from fast.decoder import GraphedStep, StaticCache, StaticDecoder, slot_mask  # noqa: F401
from fast.packing import (Packed, Packing, SteadyPacking, key_cost, pack_rows,  # noqa: F401
                          pack_width, packed, plan_packing, round_up)
from fast.train_graph import GraphedLoss, pad_batch  # noqa: F401

# model.py's hooks for the "flex" path: FlexAttention, its block mask and score_mod made once a
# batch
M.ATTENTION["flex"] = flex
M.DESCRIBED["flex"] = describe_flex

_COMPILED = {}


# --- The switch for training ---------------------------------------------------------------------
def speed_up(model, compile=True, dynamic=False, copy_scores="auto"):
    """train.py's switch into this layer: on CUDA, the relative bias's BucketBias backward and
    PALM's fast copy scores (copy_scores: fast_copy_scores's way, "auto" by default); with
    compile, torch.compile of every block (any device; dynamic: compile_blocks's). -> model. On a
    CPU without compile it changes nothing (tests/test_fast.py)."""
    if next(model.parameters()).is_cuda:
        if model.rel_bias is not None:
            model.rel_bias.fast_lookup = BucketBias.apply
        if model.copy_head is not None:
            model.copy_head.fast_scores = fast_copy_scores(copy_scores)
    if compile:
        compile_blocks(model, dynamic)
    return model


def compile_blocks(model, dynamic=False):
    """torch.compile each Transformer block (regional compilation): the blocks are alike, so one
    compilation serves them all, in a fraction of the time of compiling the whole model; embeddings
    and heads stay eager. Twin: the eager blocks (bench/check_cuda.py compares them on a GPU)."""
    # dynamic=False compiles once per shape, and past the recompile limit runs new shapes
    # uncompiled: PALM's 9 lengths went past dynamo's default limit of 8 (on an H200, train.py's
    # loop at 0.79 of the bare step), the study's ERNIE-GEN pre-training, whose count of rows
    # changes with the examples it skips, compiled 23 times in 200 steps, 4x slower
    # (bench/RESULTS.md, "The study"). train.py compiles with dynamic=True: once, for any shape
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    # Under DDP, dynamo's DDPOptimizer cuts every graph it compiles inside DDP's forward at DDP's
    # 25 MB gradient buckets: a base block (28 MB of fp32 weights) became two graphs, twice the
    # calls and less fusion, and train.py under torchrun with one process ran at 0.87 of one GPU
    # alone (bench/RESULTS.md, "DDP"). Compiled one block at a time, the gradients
    # already come block by block, where DDP's reducer starts its all-reduces: nothing to cut
    torch._dynamo.config.optimize_ddp = False
    # torch.compile's kernels are Triton's: from compute capability 7.0 (model.fast_pieces)
    if not on_card(model, "compile"):
        return model
    for block in model.blocks:
        block.compile(dynamic=dynamic)
    return model


# --- PALM's copy scores, fused ------------------------------------------------------------------
def compiled_additive_scores():
    """model.additive_scores compiled (its twin; bench/check_cuda.py compares values and gradients
    on a GPU): one fused kernel that never writes the (B, T, S, d) tensor and recomputes the tanh in
    backward, what makes PALM's copy head cheap on a GPU."""
    if "scores" not in _COMPILED:
        _COMPILED["scores"] = torch.compile(M.additive_scores, dynamic=True)
    return _COMPILED["scores"]


def fast_copy_scores(way="auto"):
    """PALM's copy scores on a GPU: "compiled" (compiled_additive_scores), "triton"
    (fast/triton_additive.py), or "auto": Triton's where triton imports, on a GPU of compute
    capability 8.0 or more (timed and checked on sm_90 only), for a full tile of target rows or more
    (training: a PALM step at base size 45.9 ms against 56.2 ms compiled on an H200), the compiled
    function for fewer (decoding's one row a beam: beam 5 took 0.360 s a batch with Triton's tiles,
    0.277 s compiled; bench/RESULTS.md, "Decoding")."""
    if way not in ("auto", "triton", "compiled"):
        raise ValueError(f"copy_scores {way!r}: auto, triton or compiled")
    compiled = compiled_additive_scores()
    cuda = torch.cuda.is_available()
    # Triton's kernels from compute capability 8.0 (model.fast_pieces)
    older_gpu = way == "auto" and cuda and not M.fast_pieces(torch.cuda.get_device_capability())[
        "triton"]
    if way == "compiled" or older_gpu:
        return compiled
    try:
        from fast import triton_additive
    except ImportError:
        if way == "triton":
            raise
        return compiled
    if way == "triton":
        return triton_additive.additive_scores
    rows = triton_additive.FORWARD[0]

    def scores(hm, ws, w):
        return (triton_additive.additive_scores if ws.size(1) >= rows else compiled)(hm, ws, w)
    return scores


def use_triton_bias(model, on=True):
    """Run the model's attention through fast/triton_bias.py's Triton kernel (the mask rule and
    the relative position bias inside the tiles, the bias gradient reduced per tile): the "flex"
    path's describe_flex hands every block that kernel's inputs. CUDA, or a CPU under Triton's
    interpreter (TRITON_INTERPRET=1, slow: tests only). Needs triton, which the project does not
    require. Twin: Transformer.encode on the naive path (bench/check_triton.py; bench/check_cuda.py
    on a GPU). -> model."""
    if on:
        need_card(model, "triton", "use_triton_bias")
        from fast import triton_bias                    # noqa: F401  (fails here without triton)
        model.config.attn_impl = "flex"
    model.triton_bias = on
    return model


def use_triton_additive(model, on=True):
    """Compute PALM's copy scores (Eq. 3) with fast/triton_additive.py's Triton kernels (tiles of
    scores, as a matrix product: hm and ws read once a tile, not once a (t, j) pair), as speed_up
    does for training on CUDA where triton imports. CUDA, or a CPU under Triton's interpreter
    (TRITON_INTERPRET=1, slow: tests only). Needs triton, which the project does not require. Twin:
    model.additive_scores (bench/check_triton.py additive; bench/check_cuda.py on a GPU). -> model;
    off: the readable function again."""
    if model.copy_head is not None:
        if on:
            need_card(model, "triton", "use_triton_additive")
            from fast import triton_additive                # fails here without triton
            model.copy_head.fast_scores = triton_additive.additive_scores
        else:
            model.copy_head.fast_scores = None
    return model


def on_card(model, piece):
    """Whether the model's card runs this piece of the fast layer (model.fast_pieces); True on a
    CPU, where the tests run the pieces that can run there."""
    if not next(model.parameters()).is_cuda:
        return True
    return M.fast_pieces(torch.cuda.get_device_capability())[piece]


def need_card(model, piece, what):
    """A ValueError of one line where the model's CUDA card cannot run this piece."""
    if not on_card(model, piece):
        least = ".".join(map(str, M.FAST_PIECES[piece]))
        raise ValueError(f"{what}: {piece} needs compute capability {least} or more")


# --- The switch for decoding ---------------------------------------------------------------------
def decoding(graphed=True):
    """generate.Decoding of the fast layer: StaticDecoder (its step replayed as a CUDA graph where
    graphed; eager otherwise, as tests run it on a CPU) and fast/beam.py's searches, no host sync a
    step. Twin: generate.READABLE (tests/test_fast_beam.py: the same hypotheses)."""
    return G.Decoding(functools.partial(StaticDecoder, graphed=graphed), beam.greedy,
                      beam.beam_search)

"""Greedy and beam search with a KV cache: ONE incremental decoder for every objective
(docs/how-it-fits-together.md, "Contracts").

Seq2seq layout (objectives/__init__.py): the source `[SOS] src [EOS]` sits at positions 0..S-1
with segment segments[0]; the target part at positions S, S+1, ... with segment segments[1]. The
source is encoded ONCE into a KV cache (per-layer keys and values; StaticKVCache below,
model.KVCache preallocated); each step runs only its new tokens:

    query token q ([MASK] UniLM 2.5, [P] UniLMv2 3.4, [ATTN] ERNIE-GEN 3.3 infilling decoding):
        step t feeds  y_{t-1} @ S+t-1 (t > 0)  and  q @ S+t,  both with segment segments[1];
        y_{t-1} sees source + y_<=t-1, q sees source + y_<t + itself; y_t is read at q;
        then y_{t-1} is committed to the cache (cache.commit(1)) and q is dropped.
    no query token (PALM 2.3): step t feeds y_{t-1} @ S+t (y_{-1} = [SOS]); its own state
        predicts y_t through the pointer-generator (objective.decode_logprobs with the source
        states), and it is committed.

Both are one rule: at step t the target part is [y_0 .. y_{t-1}, q] or [[SOS], y_0 .. y_{t-1}];
its column i sees the real source and target columns <= i (the seq2seq mask) and the last column
predicts y_t. The cached decoder runs only the columns not yet in the cache; `use_cache=False`
(--no_cache) recomputes every column every step with the very same ids, positions, segments and
mask: the reference the tests hold the cache to. Sources of different lengths are right-padded;
each row's target starts at its own S_b and padding keys are never attended.

Static shapes and CUDA graphs: at base size a step launches several hundred small kernels, and on
a GPU their launch cost, not the GPU work, is the step's time. By default (cuda_graph=None) the
cache runs in full-capacity mode (FullCapacityKVCache): new keys and values are written at a fill
index held on the device and every layer attends to the whole buffer, the mask hiding the slots
not written yet, so every step has the same shapes; on CUDA the step (the blocks and
decode_logprobs) is then captured once as a CUDA graph and replayed (GraphedStep), elsewhere it
runs eagerly with the same numbers. Beam reorders and the search stay outside the graph.
cuda_graph=False (--no_cuda_graph) runs StaticKVCache's growing views eagerly.

Beam search runs a flattened (sources x beams) batch: each step adds the log-probabilities of
every one-token extension to its beam's total, keeps the top 2K per source, puts those ending in
[EOS] aside as finished (score = total / GNMT length penalty ((5 + len) / 6)^alpha, Wu et al.
2016 section 7) and continues with the best K others; the cache, the history and the source
extras are reordered to follow them. A source stops once it has K finished hypotheses (fairseq's
rule) or at max_len, where live beams are finished as they are.
No-repeat n-grams follow the official UniLM decoder (`get_dup_ngram_candidates`): a token is
forbidden when it would repeat an n-gram of the hypothesis, unless that n-gram contains an ignore
word (default ".", so a sentence opening such as ". the" may recur).

Run:  python generate.py --ckpt out/model.pt --input test.src --output test.hyp --beam 5
Checkpoints are read as data (utils.read_checkpoint: torch.load(weights_only=True)); a bad flag or
file is one line on stderr, `generate.py: error: ...`, and exit status 2.
Left out: sampling (top-k / nucleus), diverse beams, constrained decoding, HF's early_stopping
heuristics.
"""
import argparse
import contextlib
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import model as M
from objectives import get_objective, pad
from tokenizer import WordPiece
from utils import (DataError, UsageError, atomic_write, exit_with_error, pick_device,
                   read_checkpoint, read_lines)

NEG_INF = float("-inf")


def gnmt_penalty(n, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha; |Y| counts the generated tokens, [EOS] included."""
    return ((5 + n) / 6) ** alpha


# -------------------------------------------------------------------------------------------------
# The incremental decoder: one rule for every objective


class StaticKVCache(M.KVCache):
    """model.KVCache with preallocated buffers (N, H, capacity, D) per layer.

    model.KVCache concatenates, which copies the whole cache in every layer at every step (on an
    H100 that was 3/4 of the decoding time at base size); here new keys/values are written in
    place and the layers attend to a view. A beam reorder that keeps every row with its source
    (`same_sources`) moves only the target part: the beams of one source share the source's keys
    and values.
    """

    def __init__(self, n_layer, capacity, n_src):
        super().__init__(n_layer)
        self.capacity = capacity
        self.n_src = n_src
        self.n = 0
        self.pos_buf = None

    def __len__(self):
        return self.n

    def buffers(self, i, k_new):
        """Layer i's key and value buffers (N, H, capacity, D), made at its first forward."""
        if self.k[i] is None:
            shape = (*k_new.shape[:2], self.capacity, k_new.size(3))
            self.k[i] = k_new.new_zeros(shape)
            self.v[i] = k_new.new_zeros(shape)
        return self.k[i], self.v[i]

    def layer(self, i, k_new, v_new):
        k, v = self.buffers(i, k_new)
        end = self.n + k_new.size(2)
        # written in place, uncommitted until commit()
        k[:, :, self.n:end] = k_new
        v[:, :, self.n:end] = v_new
        return k[:, :, :end], v[:, :, :end]                        # (N, H, Lc + L, D) views

    def commit(self, n):
        if self.pos_buf is None:
            self.pos_buf = self.pending_pos.new_zeros(self.pending_pos.size(0), self.capacity)
        self.pos_buf[:, self.n:self.n + n] = self.pending_pos[:, :n]
        # the keys/values are already in place; a dropped query is overwritten by the next step
        self.n += n
        self.pos = self.pos_buf[:, :self.n]

    def reorder(self, index, same_sources=False):
        if same_sources:
            # only the target part differs between the beams of one source
            for buf in self.k + self.v:
                buf[:, :, self.n_src:self.n] = buf[:, :, self.n_src:self.n].index_select(0, index)
        else:
            self.k = [b.index_select(0, index) for b in self.k]
            self.v = [b.index_select(0, index) for b in self.v]
            self.pos_buf = self.pos_buf.index_select(0, index)
        self.pos = self.pos_buf[:, :self.n]


class FullCapacityKVCache(StaticKVCache):
    """StaticKVCache in full-capacity mode: every decoding step has the same shapes, which a CUDA
    graph needs (GraphedStep).

    The new keys, values and positions are written at the fill index, a DEVICE tensor that commit()
    advances in place, and every layer attends to the WHOLE (N, H, capacity, D) buffer: the
    decoder's mask (N, L, capacity) hides the slots not written yet. Nothing a step runs reads a
    Python number that changes from step to step; `n` is the same count on the host, for the
    bookkeeping outside the step (len, beam reorders).
    """

    def __init__(self, n_layer, capacity, n_src, device):
        super().__init__(n_layer, capacity, n_src)
        self.fill = torch.zeros((), dtype=torch.long, device=device)
        self.slots = None

    def key_positions(self, position_ids):
        """Write the new tokens' positions (N, L) at their slots -> every slot's position
        (N, capacity)."""
        if self.pos_buf is None:
            self.pos_buf = position_ids.new_zeros(position_ids.size(0), self.capacity)
        # this forward's slots: fill, fill + 1, ... (encode calls this once, before the layers)
        self.slots = self.fill + torch.arange(position_ids.size(1), device=position_ids.device)
        self.pos_buf.index_copy_(1, self.slots, position_ids)
        return self.pos_buf

    def layer(self, i, k_new, v_new):
        k, v = self.buffers(i, k_new)
        # written in place, uncommitted until commit()
        k.index_copy_(2, self.slots, k_new)
        v.index_copy_(2, self.slots, v_new)
        return k, v                                                # (N, H, capacity, D)

    def commit(self, n):
        # keys, values and positions are already in place; a dropped query's slot is overwritten
        # by the next step
        self.n += n
        self.fill += n


class GraphedStep:
    """fn(*inputs) -> tensor, recorded once as a CUDA graph and replayed: one launch for a whole
    decoding step instead of one per kernel (at base size several hundred kernels, whose launches
    cost the CPU milliseconds for well under a millisecond of GPU work).

    torch.cuda.graph's documented pattern: fn runs once on a side stream first (cuBLAS handles,
    autotuning, torch.compile happen outside the capture), then it is captured on static copies of
    the inputs. A call copies its inputs into them, replays, and returns a copy of the static
    output; fn's writes into the cache replay too. The graph holds the addresses of every tensor fn
    reads or writes: it is valid only while none of them is reallocated (Decoder.reorder).
    """

    def __init__(self, fn, *inputs):
        with torch.cuda.device(inputs[0].device):
            self.inputs = [x.clone() for x in inputs]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=side):
                self.output = fn(*self.inputs)

    def __call__(self, *inputs):
        for static, x in zip(self.inputs, inputs):
            static.copy_(x)
        self.graph.replay()
        return self.output.clone()


def step_mode(cuda_graph, use_cache, device):
    """generate's cuda_graph option -> (static shapes?, replayed as a CUDA graph?). None: static
    shapes, replayed on CUDA and run eagerly elsewhere; True: the same, and a ValueError where no
    graph can run; False: StaticKVCache's growing views, eagerly."""
    if cuda_graph and (device.type != "cuda" or not use_cache):
        raise ValueError(f"cuda_graph=True needs the KV cache on a CUDA device (here: "
                         f"{device.type}, use_cache={use_cache}); None uses it where it can run")
    static = use_cache and cuda_graph is not False
    return static, static and device.type == "cuda"


class Decoder:
    """Decoding state of N rows (sources x beams): src_ids (N, S) right-padded, src_len (N,),
    tgt (N, t) so far. cuda_graph: generate's option (step_mode)."""

    def __init__(self, model, objective, sources, max_len, use_cache=True, cuda_graph=None):
        tok = objective.tok
        self.model = model
        self.objective = objective
        self.seg_src, self.seg_tgt = objective.segments
        query = objective.query_token
        self.query = None if query is None else tok.token_to_id(query)
        self.sos = tok.sos_id
        device = next(model.parameters()).device
        self.static, self.graphed = step_mode(cuda_graph, use_cache, device)
        self.graph = None                      # the GraphedStep, captured at the first graphed step
        src = [[tok.sos_id] + list(s) + [tok.eos_id] for s in sources]
        self.src_ids = pad(src, tok.pad_id).to(device)                          # (N, S)
        self.src_len = torch.tensor([len(s) for s in src], device=device)      # (N,)  S_b
        self.S = self.src_ids.size(1)
        self.tgt = self.src_ids.new_zeros(len(src), 0)                         # (N, t)
        self.cache = None
        self.source = None
        if use_cache:
            # room for the source, max_len target tokens and the query
            capacity = self.S + max_len + 1
            n_layer = model.config.n_layer
            ids, pos, seg, mask = self._inputs(0, with_target=False)
            if self.static:
                self.cache = FullCapacityKVCache(n_layer, capacity, self.S, device)
                # the layers attend to the whole buffer: the target slots stay hidden
                mask = F.pad(mask, (0, capacity - self.S))
            else:
                self.cache = StaticKVCache(n_layer, capacity, self.S)
            # encode the source once; its keys and values stay in the cache
            h = model(ids, pos, seg, mask, cache=self.cache)
            self.cache.commit(self.S)
            self.source = self._source_extras(h)

    def _target_part(self):
        """(N, t + 1): [y_0 .. y_{t-1}, query], or without a query token [[SOS], y_0 .. y_{t-1}]."""
        if self.query is not None:
            return torch.cat([self.tgt, self.tgt.new_full((self.tgt.size(0), 1), self.query)], 1)
        return torch.cat([self.tgt.new_full((self.tgt.size(0), 1), self.sos), self.tgt], dim=1)

    def _inputs(self, start, with_target=True):
        """ids, positions, segments (N, L - start) and mask (N, L - start, L) of columns start..
        of the sequence."""
        N = self.src_ids.size(0)
        S = self.S
        dev = self.src_ids.device
        ids = self.src_ids
        pos = torch.arange(S, device=dev).expand(N, S)
        seg = torch.full_like(ids, self.seg_src)
        if with_target:
            part = self._target_part()                                         # (N, T)
            ids = torch.cat([ids, part], dim=1)
            # each row's target starts right after its own source: positions S_b, S_b + 1, ...
            tgt_pos = self.src_len[:, None] + torch.arange(part.size(1), device=dev)
            pos = torch.cat([pos, tgt_pos], dim=1)
            seg = torch.cat([seg, torch.full_like(part, self.seg_tgt)], dim=1)
        L = ids.size(1)
        i = torch.arange(start, L, device=dev)[None, :, None]                  # query columns
        j = torch.arange(L, device=dev)[None, None, :]                         # key columns
        real_src = (j < S) & (j < self.src_len[:, None, None])   # source padding stays hidden
        mask = real_src | ((j >= S) & (j <= i))                  # target column i sees <= i
        return ids[:, start:], pos[:, start:], seg[:, start:], mask

    def _source_extras(self, h):
        """What decode_logprobs may use (PALM's copy head): final-layer source states, ids and
        the real-token mask."""
        real = torch.arange(self.S, device=h.device)[None] < self.src_len[:, None]    # (N, S)
        return dict(hidden=h[:, :self.S], ids=self.src_ids, mask=real)

    @torch.no_grad()
    def logprobs(self):
        """Run this step's new columns -> log-probabilities (N, V) of the next token y_t."""
        if self.static:
            return self._static_logprobs()
        # without a cache every column runs again
        start = len(self.cache) if self.cache is not None else 0
        h = self.model(*self._inputs(start), cache=self.cache)                 # (N, n_new, d)
        if self.cache is None:
            self.source = self._source_extras(h)
        elif (n := h.size(1) - (self.query is not None)) > 0:
            # y_{t-1} joins the cache; the query token is dropped
            self.cache.commit(n)
        return self.objective.decode_logprobs(self.model, h[:, -1], self.source)

    def _static_logprobs(self):
        """logprobs() with static shapes: the new columns' inputs are built from the cache's fill
        index, src_len and the last tokens, not from the whole sequence; _static_step runs them,
        replayed as a CUDA graph from the second step on where self.graphed."""
        # the target columns not in the cache yet: [y_{t-1}, query] ([query] alone at t = 0), or
        # [y_{t-1}] ([SOS] at t = 0)
        ids = self._target_part()[:, len(self.cache) - self.S:]                # (N, n_new)
        cols = self.cache.fill + torch.arange(ids.size(1), device=ids.device)  # (n_new,) slots
        # each row's target starts right after its own source: positions S_b, S_b + 1, ...
        pos = self.src_len[:, None] + (cols - self.S)                           # (N, n_new)
        # embedded outside the graph (as measured; embed's position check, which reads the GPU
        # and so cannot be captured, now runs on CPU tensors only)
        x = self.model.embed(ids, pos, torch.full_like(ids, self.seg_tgt))
        # t = 0 runs eagerly: with a query token it has one column fewer than the later steps
        if self.graphed and self.tgt.size(1) > 0:
            if self.graph is None:
                self.graph = GraphedStep(self._static_step, x, pos, cols)
            logp = self.graph(x, pos, cols)
        else:
            logp = self._static_step(x, pos, cols)
        # y_{t-1} joins the cache; the query token is dropped
        self.cache.commit(ids.size(1) - (self.query is not None))
        return logp

    def _static_step(self, x, pos, cols):
        """The blocks over the embedded new columns x (N, n_new, d) at positions pos (N, n_new) and
        cache slots cols (n_new,), attending to the whole cache, then decode_logprobs -> (N, V).
        Every shape is the same at every step (GraphedStep records this)."""
        j = torch.arange(self.cache.capacity, device=x.device)                 # key slots
        # slot j: a real source token, or a target slot up to the column's own (later ones are not
        # written yet); every column sees its own slot, so encode's padding for dead rows never
        # applies
        mask = (j < self.src_len[:, None, None]) | ((j >= self.S) & (j <= cols[:, None]))
        h = self.model.encode(x, pos, mask, self.cache)                         # (N, n_new, d)
        return self.objective.decode_logprobs(self.model, h[:, -1], self.source)

    def append(self, tokens):
        self.tgt = torch.cat([self.tgt, tokens[:, None]], dim=1)

    def reorder(self, index, same_sources=False):
        """Keep rows `index`; same_sources: each row stays with its source (a beam step that
        drops no source)."""
        self.tgt = self.tgt.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index, same_sources)
        if same_sources:
            return                             # source ids, lengths and states are already right
        self.src_ids = self.src_ids.index_select(0, index)
        self.src_len = self.src_len.index_select(0, index)
        if self.source is not None:
            self.source = {k: v.index_select(0, index) for k, v in self.source.items()}
        if self.graph is not None:
            # Sources finished: the cache was reallocated under the graph, so the graph goes and
            # the step runs eagerly (the same numbers) from here on. Rows only ever leave, so a
            # graph is never replayed once its rows change (a dict of graphs by N would never be
            # hit), and a new graph per set of rows costs a warm-up step plus a capture, a few
            # eager steps, at every change: a loss when sources finish a step or two apart.
            # Eagerly, a batch costs at most one capture. (min_len = max_len keeps every row.)
            self.graph = None
            self.graphed = False


def ban_tokens(logp, tgt, step, eos, min_len, banned, no_repeat_ngram, ignore):
    """Forbid in place: [EOS] before min_len, the `banned` ids, and tokens that would repeat an
    n-gram of tgt."""
    logp[:, banned] = NEG_INF
    if step < min_len:
        logp[:, eos] = NEG_INF
    n = no_repeat_ngram
    if n and tgt.size(1) >= n:
        win = tgt.unfold(1, n, 1)                              # (N, W, n): every n-gram so far
        tail = tgt[:, tgt.size(1) - n + 1:]                    # the last n - 1 tokens
        hit = (win[..., :-1] == tail[:, None]).all(-1)         # n-grams that start with the tail
        if ignore is not None:
            # UniLM: an n-gram holding an ignore word may repeat
            hit &= ~torch.isin(win, ignore).any(-1)
        # scatter_add, not scatter: two windows may end in the same token
        count = torch.zeros_like(logp).scatter_add_(1, win[..., -1], hit.to(logp.dtype))
        logp.masked_fill_(count > 0, NEG_INF)
    return logp


# -------------------------------------------------------------------------------------------------
# Greedy and beam search over one batch of sources


@torch.no_grad()
def greedy(dec, max_len, alpha, rules):
    """argmax at every step -> one [(ids, score)] per row of dec."""
    out = [None] * len(dec.src_len)
    rows = list(range(len(dec.src_len)))                       # the source of each live row
    total = torch.zeros(len(rows), device=dec.src_ids.device)
    for t in range(max_len):
        best, tok = ban_tokens(dec.logprobs(), dec.tgt, t, **rules).max(dim=-1)
        total += best
        dec.append(tok)
        done = (tok == rules["eos"]) | (t == max_len - 1)
        if done.any():
            for r in done.nonzero().flatten().tolist():
                ids = dec.tgt[r].tolist()              # with its [EOS], unless max_len cut it
                score = total[r].item() / gnmt_penalty(len(ids), alpha)
                out[rows[r]] = [(ids[:-1] if ids[-1] == rules["eos"] else ids, score)]
            # finished rows leave the batch
            keep = (~done).nonzero().flatten()
            rows = [rows[r] for r in keep.tolist()]
            total = total[keep]
            dec.reorder(keep)
        if not rows:
            break
    return out


@torch.no_grad()
def beam_search(dec, K, max_len, alpha, rules):
    """Beam search of width K -> for each row of dec (one source) its finished hypotheses, best
    first."""
    B = len(dec.src_len)
    eos = rules["eos"]
    dev = dec.src_ids.device
    # rows: source b, beam k -> b * K + k
    dec.reorder(torch.arange(B, device=dev).repeat_interleave(K))
    scores = torch.full((B, K), NEG_INF, device=dev)
    scores[:, 0] = 0                    # the K copies are identical: only beam 0 may expand at t=0
    finished = [[] for _ in range(B)]
    active = list(range(B))                                    # the source of each block of K rows
    rank = torch.arange(2 * K, device=dev)
    for t in range(max_len):
        A = len(active)
        logp = ban_tokens(dec.logprobs(), dec.tgt, t, **rules)                      # (A * K, V)
        V = logp.size(-1)
        # total log-probability of every one-token extension of every beam, flattened per source
        cand = (scores[:, :, None] + logp.view(A, K, V)).view(A, K * V)
        # 2K: at most K end in [EOS], so K live ones remain
        top, idx = cand.topk(2 * K, dim=1)
        row = torch.arange(A, device=dev)[:, None] * K + idx // V    # (A, 2K) the beam extended
        tok = idx % V
        # the live beams: the K best candidates that do not end in [EOS] (stable: keeps the order)
        live = (rank + 2 * K * (tok == eos)).argsort(dim=1)[:, :K]
        live_row = row.gather(1, live)
        live_tok = tok.gather(1, live)
        live_score = top.gather(1, live)
        last = t == max_len - 1
        # finished: an [EOS] among the top K (one ranked lower is worse than every live beam)
        top_c = top.tolist()
        row_c = row.tolist()
        eos_c = (tok == eos).tolist()
        # a host copy of the histories only when a hypothesis finishes
        hist = dec.tgt.tolist() if last or any(any(e[:K]) for e in eos_c) else None
        keep = []
        for a, b in enumerate(active):
            for c in range(K):
                if eos_c[a][c] and top_c[a][c] > NEG_INF:
                    score = top_c[a][c] / gnmt_penalty(t + 1, alpha)
                    finished[b].append((hist[row_c[a][c]], score))
            if last:
                # max_len reached: live beams finish as they are
                beams = zip(live_row[a].tolist(), live_tok[a].tolist(), live_score[a].tolist())
                for r, y, s in beams:
                    if s > NEG_INF:
                        finished[b].append((hist[r] + [y], s / gnmt_penalty(t + 1, alpha)))
            elif len(finished[b]) < K:
                # early stop: K finished hypotheses end a source
                keep.append(a)
        if not keep:
            break
        k = torch.tensor(keep, device=dev)
        # the cache follows the surviving beams
        dec.reorder(live_row[k].flatten(), same_sources=len(keep) == A)
        dec.append(live_tok[k].flatten())
        scores = live_score[k]
        active = [active[a] for a in keep]
    return [sorted(f, key=lambda h: -h[1]) for f in finished]


# -------------------------------------------------------------------------------------------------
# Public API


def decoding_rules(tok, min_len, no_repeat_ngram, ignore_ids, device):
    """What `ban_tokens` forbids: specials other than [EOS]/[UNK] are never generated (a query token as
    output is meaningless), [EOS] before min_len, repeated n-grams (ignore words default to "."
    when it is in the vocab)."""
    if ignore_ids is None:
        ignore_ids = [i for i in (tok.token_to_id("."),) if i is not None]
    banned = sorted(tok.special_ids - {tok.eos_id, tok.unk_id})
    ignore = None
    if ignore_ids:
        ignore = torch.tensor(list(ignore_ids), device=device, dtype=torch.long)
    return dict(eos=tok.eos_id, min_len=min_len, no_repeat_ngram=no_repeat_ngram, ignore=ignore,
                banned=torch.tensor(banned, device=device, dtype=torch.long))


def max_source_len(model, max_len):
    """Longest source (without [SOS]/[EOS]) whose target positions up to S + max_len - 1 fit
    max_position."""
    return model.config.max_position - max_len - 2


@torch.no_grad()
def generate(model, objective, sources, beam_size=1, max_len=64, min_len=1, length_penalty=1.0,
             no_repeat_ngram=3, ignore_ids=None, n_best=1, use_cache=True, batch_size=32,
             progress=False, cuda_graph=None):
    """Decode token-id sources -> for each, up to n_best (token_ids, score) pairs, best first.

    token_ids exclude the final [EOS]; score = sum of log-probs / ((5 + len) / 6)^length_penalty.
    beam_size 1 is greedy search. Sources too long for model.config.max_position are truncated
    (from the right) with a warning. cuda_graph (with the cache): None runs every step with
    static shapes, replayed as a CUDA graph on CUDA and eagerly elsewhere; True insists on the
    graph (a ValueError without CUDA or cache); False runs the cache of growing views eagerly.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best={n_best} must be between 1 and beam_size={beam_size}")
    if not 0 <= min_len <= max_len or max_len < 1:
        raise ValueError(f"need 0 <= min_len ({min_len}) <= max_len ({max_len}) and max_len >= 1")
    limit = max_source_len(model, max_len)
    if limit < 0:
        raise ValueError(f"max_len={max_len} leaves no room for a source in max_position="
                         f"{model.config.max_position}")
    n_long = sum(len(s) > limit for s in sources)
    if n_long:
        warnings.warn(f"generate: {n_long} source(s) longer than {limit} tokens (max_position "
                      f"{model.config.max_position} - max_len {max_len} - 2) truncated",
                      stacklevel=2)
    device = next(model.parameters()).device
    # a cuda_graph that cannot run fails here, before any work
    step_mode(cuda_graph, use_cache, device)
    rules = decoding_rules(objective.tok, min_len, no_repeat_ngram, ignore_ids, device)
    was_training = model.training
    model.eval()
    # similar lengths share a batch: less padding
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    results = [None] * len(sources)
    bar = tqdm(total=len(sources), desc="generate", disable=not progress, unit="src")
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        dec = Decoder(model, objective, [list(sources[i])[:limit] for i in chunk], max_len,
                      use_cache, cuda_graph)
        if beam_size == 1:
            out = greedy(dec, max_len, length_penalty, rules)
        else:
            out = beam_search(dec, beam_size, max_len, length_penalty, rules)
        for i, hyps in zip(chunk, out):
            results[i] = hyps[:n_best]
        bar.update(len(chunk))
    bar.close()
    model.train(was_training)
    return results


def generate_text(model, tokenizer, objective, texts, **kwargs):
    """Text-level helper: strings in, best hypothesis strings out; a blank text gives ""."""
    keep = [i for i, t in enumerate(texts) if t.strip()]
    hyps = generate(model, objective, [tokenizer.encode(texts[i]) for i in keep], **kwargs)
    out = [""] * len(texts)
    for i, h in zip(keep, hyps):
        out[i] = tokenizer.decode(h[0][0], skip_special=True) if h else ""
    return out


@torch.no_grad()
def score_targets(model, objective, sources, targets, use_cache=True, cuda_graph=None):
    """Teacher forcing through the decoding loop: per-step log P(y_t | y_<t, src) of each given
    target (N lists); use_cache and cuda_graph as in generate.

    Targets are forced exactly as given (add the final [EOS] yourself to score it). Tests compare
    these scores with the fine-tuning batch's log-probs: a layout mismatch between training and
    decoding shows up here.
    """
    forced = pad(targets, objective.tok.eos_id)                                # (N, T)
    dec = Decoder(model, objective, sources, forced.size(1), use_cache, cuda_graph)
    forced = forced.to(dec.src_ids.device)
    steps = []
    for t in range(forced.size(1)):
        steps.append(dec.logprobs().gather(1, forced[:, t:t + 1]).squeeze(1))
        dec.append(forced[:, t])
    logp = torch.stack(steps, dim=1)                                           # (N, T)
    return [logp[b, :len(y)] for b, y in enumerate(targets)]


def load_checkpoint(path, device="cpu"):
    """A train.py checkpoint -> (model in eval mode, tokenizer, seq2seq objective).

    The file is read as data (utils.read_checkpoint, torch.load(weights_only=True)): a pickle that
    holds Python objects is refused, never run. A missing, unreadable, foreign or mismatched file
    is a UsageError naming it.
    """
    ckpt = read_checkpoint(path, device)
    try:
        cfg = M.ModelConfig.from_dict(ckpt["model_config"])
        model = M.Transformer(cfg)
        # torch.compile and DDP wrap parameter names: strip their prefixes
        state = {re.sub(r"^(module\.|_orig_mod\.)+", "", k): v for k, v in ckpt["model"].items()}
        model.load_state_dict(state)
        tok = WordPiece(ckpt["vocab"], lowercase=ckpt.get("lowercase", True))
        options = ckpt.get("objective_options", {})
        objective = get_objective(ckpt["objective"], tok, task="seq2seq",
                                  max_len=cfg.max_position, **options)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        # load_state_dict's message spans lines: the one-line report keeps its words
        why = " ".join(str(e).split())[:300]
        raise UsageError(f"{path}: the checkpoint does not fit this code "
                         f"({type(e).__name__}: {why})") from None
    return model.to(device).eval(), tok, objective


# -------------------------------------------------------------------------------------------------
# Command line

PROG = "generate.py"


def read_sources(path):
    """One source a line (utils.read_lines: '\\n' only), or jsonl with a "src" field; blank lines
    are kept (as "") so line counts match."""
    if not os.path.isfile(path):
        raise DataError(f"input not found: {path}")
    lines = read_lines(path)
    if not str(path).endswith(".jsonl"):
        return lines
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            out.append("")
            continue
        try:
            src = json.loads(line)["src"]
        except (json.JSONDecodeError, KeyError, TypeError):
            src = None
        if not isinstance(src, str):
            raise DataError(f"{path}:{n}: expected a JSON object with a string \"src\" field")
        out.append(src)
    return out


def check_output(path):
    """--output must not be a folder, and its folder must exist or be creatable (nothing is
    created here: a later error leaves no trace)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--output {path}: is a directory")
    folder = path.parent
    # the nearest folder that exists must be a folder we may write into
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"--output {path}: cannot make its folder ({folder} is a file)")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {path}: {folder} is not writable")


def check_args(args):
    """Every flag, before anything slow runs; a mistake is a UsageError (one line, exit 2)."""
    if args.beam < 1:
        raise UsageError(f"--beam must be >= 1, got {args.beam}")
    if args.max_len < 1:
        raise UsageError(f"--max_len must be >= 1, got {args.max_len}")
    if not 0 <= args.min_len <= args.max_len:
        raise UsageError(f"--min_len must be between 0 and --max_len ({args.max_len}), "
                         f"got {args.min_len}")
    if not 1 <= args.n_best <= args.beam:
        raise UsageError(f"--n_best must be between 1 and --beam ({args.beam}), got {args.n_best}")
    if args.batch_size < 1:
        raise UsageError(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.no_repeat_ngram < 0:
        raise UsageError(f"--no_repeat_ngram must be >= 0 (0 = off), got {args.no_repeat_ngram}")
    if not math.isfinite(args.length_penalty):
        raise UsageError(f"--length_penalty must be a finite number, got {args.length_penalty}")
    # the same words as utils.read_checkpoint, checked before the slow part
    if not os.path.isfile(args.ckpt):
        raise UsageError(f"checkpoint not found: {args.ckpt}")
    if not os.path.isfile(args.input):
        raise UsageError(f"input not found: {args.input}")
    if os.path.getsize(args.input) == 0:
        raise UsageError(f"input {args.input} is empty (one source a line)")
    check_output(args.output)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--input", required=True,
                   help="one source a line, or .jsonl with a \"src\" field")
    p.add_argument("--output", required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length_penalty", type=float, default=1.0)
    p.add_argument("--min_len", type=int, default=1)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--no_repeat_ngram", type=int, default=3, help="0 = off")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--n_best", type=int, default=1,
                   help="> 1 writes a JSON list of {text, score} a line")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--no_cache", action="store_true",
                   help="recompute every token at every step (the reference)")
    p.add_argument("--no_cuda_graph", action="store_true",
                   help="run the cached step eagerly on growing views (by default every step has "
                        "static shapes and is replayed as a CUDA graph on a GPU)")
    return p.parse_args(argv)


def run(args):
    """Check, read, decode, write: generate.py's whole job."""
    check_args(args)
    device = pick_device(args.device)
    texts = read_sources(args.input)
    model, tok, objective = load_checkpoint(args.ckpt, device)
    if max_source_len(model, args.max_len) < 0:
        raise UsageError(f"--max_len {args.max_len} leaves no room for a source in this model "
                         f"(max_position {model.config.max_position})")
    # blank lines stay blank
    keep = [i for i, t in enumerate(texts) if t.strip()]
    amp = contextlib.nullcontext()
    if device.type == "cuda":
        amp = torch.autocast("cuda", torch.bfloat16)
    with amp:
        hyps = generate(model, objective, [tok.encode(texts[i]) for i in keep],
                        beam_size=args.beam, max_len=args.max_len, min_len=args.min_len,
                        length_penalty=args.length_penalty, no_repeat_ngram=args.no_repeat_ngram,
                        n_best=args.n_best, use_cache=not args.no_cache,
                        batch_size=args.batch_size, progress=True,
                        cuda_graph=False if args.no_cuda_graph else None)
    lines = [""] * len(texts)
    for i, h in zip(keep, hyps):
        decoded = [(tok.decode(ids, skip_special=True), s) for ids, s in h]
        if args.n_best == 1:
            lines[i] = decoded[0][0] if decoded else ""
        else:
            lines[i] = json.dumps([{"text": t, "score": round(s, 4)} for t, s in decoded])
    # through a temp file: an interrupted run never leaves half an output
    atomic_write(args.output, "".join(line + "\n" for line in lines))
    print(f"wrote {len(lines)} lines to {args.output}", file=sys.stderr)


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except UsageError as e:                          # DataError included: the user's to fix
        exit_with_error(PROG, e)


if __name__ == "__main__":
    main()

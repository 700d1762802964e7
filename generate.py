"""Greedy and beam search with a KV cache: ONE incremental decoder for every objective.

The source `[SOS] src [EOS]` (positions 0..S-1, segment segments[0]) is encoded once into a KV
cache (model.KVCache); step t runs only its new tokens (segment segments[1]):
    query token q ([MASK] UniLM 2.5, [P] UniLMv2 3.4, [ATTN] ERNIE-GEN 3.3): y_{t-1} @ S+t-1 and
        q @ S+t; y_t is read at q, then y_{t-1} is committed to the cache and q dropped.
    no query token (PALM 2.3, MASS): y_{t-1} @ S+t (y_{-1} = [SOS]) predicts y_t and is committed.
Their mask is objectives/masks.py's rule. `use_cache=False` (--no_cache) recomputes every column
every step: the reference the tests hold the cache to. Beam search: GNMT's length penalty (Wu et
al. 2016, section 7), K finished hypotheses end a source (fairseq), no-repeat n-grams as UniLM's
decoder. generate() takes another `Decoding` (a Decoder subclass and two searches): on CUDA the
command line's door hands it the fast layer's (fast.decoding(): a static-shape step replayed as a
CUDA graph, the search on the device); --no_cuda_graph keeps the readable ones. docs/decoding.md
traces it.
Run:  python generate.py --ckpt out/pmlm-seq2seq/ckpt.pt --input test.src --output test.hyp --beam 5
Left out: sampling (top-k / nucleus), diverse beams, constrained decoding.
"""
import argparse
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from tqdm import tqdm

import model as M
from objectives import get_objective, masks, pad
from objectives.masks import CTX, ORIG, PAD, PSEUDO
from tokenizer import WordPiece
from utils import (DataError, UsageError, atomic_write, check_at_least, exit_with_error,
                   one_line_warnings, pick_device, read_checkpoint, read_lines)

NEG_INF = float("-inf")


def gnmt_penalty(n, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha; |Y| counts the generated tokens, [EOS] included."""
    return ((5 + n) / 6) ** alpha


# --- The incremental decoder: one rule for every objective ----------------------------------------
class Decoder:
    """Decoding state of N rows (sources x beams): src_ids (N, S) right-padded, src_len (N,),
    tgt (N, t) so far; the source encoded once into a KV cache unless use_cache is False.
    The fast layer's decoder is a subclass (fast.StaticDecoder): its own cache, step and reorder."""

    def __init__(self, model, objective, sources, max_len, use_cache=True):
        tok = objective.tok
        self.model = model
        self.objective = objective
        self.seg_src, self.seg_tgt = objective.segments
        self.query = tok.token_to_id(objective.query_token) if objective.query_token else None
        self.sos = tok.sos_id
        device = next(model.parameters()).device
        src = [[tok.sos_id] + list(s) + [tok.eos_id] for s in sources]
        self.src_ids = pad(src, tok.pad_id).to(device)                          # (N, S)
        self.src_len = torch.tensor([len(s) for s in src], device=device)      # (N,)  S_b
        self.S = self.src_ids.size(1)
        self.tgt = self.src_ids.new_zeros(len(src), 0)                         # (N, t)
        self.cache = self.source = None
        if use_cache:
            self.start_cache(max_len)

    def start_cache(self, max_len):
        """Encode the source once; its keys and values stay in the cache (max_len: the target's
        longest, for a cache that needs it)."""
        self.cache = M.KVCache(self.model.config.n_layer)
        h = self.model(*self._inputs(0, with_target=False), cache=self.cache)
        self.cache.commit(self.S)
        self.source = self._source_extras(h)

    def _target_part(self):
        """(N, t + 1): [y_0 .. y_{t-1}, query], or without a query token [[SOS], y_0 .. y_{t-1}]."""
        if self.query is not None:
            return torch.cat([self.tgt, self.tgt.new_full((self.tgt.size(0), 1), self.query)], 1)
        return torch.cat([self.tgt.new_full((self.tgt.size(0), 1), self.sos), self.tgt], dim=1)

    def _layout(self, with_target=True):
        """ids, kind and step (N, L) of the sequence so far (objectives/masks.py): the real source
        CTX, target column i ORIG of step i + 1, the query token PSEUDO of its step."""
        j = torch.arange(self.S, device=self.src_ids.device)
        kind = torch.where(j < self.src_len[:, None], CTX, PAD)                 # (N, S)
        ids, step = self.src_ids, torch.zeros_like(kind)
        if with_target:
            part = self._target_part()                                         # (N, T)
            t_kind = torch.full_like(part, ORIG)
            if self.query is not None:
                t_kind[:, -1] = PSEUDO
            t_step = torch.arange(1, part.size(1) + 1, device=part.device).expand_as(part)
            ids = torch.cat([ids, part], dim=1)
            kind = torch.cat([kind, t_kind], dim=1)
            step = torch.cat([step, t_step], dim=1)
        return ids, kind, step

    def _inputs(self, start, with_target=True):
        """ids, positions, segments (N, L - start) and mask (N, L - start, L) of columns start.."""
        ids, kind, step = self._layout(with_target)
        L = ids.size(1)
        j = torch.arange(L, device=ids.device).expand_as(ids)
        target = j >= self.S
        # the source at 0..S-1; a target token of step r at S_b + r - 1 (right after its source)
        pos = torch.where(target, self.src_len[:, None] + step - 1, j)
        seg = torch.where(target, self.seg_tgt, self.seg_src)
        mask = masks.attention_mask(kind, step, start)
        return ids[:, start:], pos[:, start:], seg[:, start:], mask

    def next_inputs(self):
        """What logprobs runs next: ids, positions, segments (N, n_new) and mask rows (N, n_new, L)
        of the columns not in the cache yet (with the query token; every column without a cache)."""
        return self._inputs(len(self.cache) if self.cache is not None else 0)

    def _source_extras(self, h):
        """What decode_logprobs may use (PALM's copy head): source states, ids, real-token mask."""
        real = torch.arange(self.S, device=h.device)[None] < self.src_len[:, None]    # (N, S)
        return dict(hidden=h[:, :self.S], ids=self.src_ids, mask=real)

    @torch.no_grad()
    def logprobs(self):
        """Run this step's new columns -> log-probabilities (N, V) of the next token y_t."""
        # without a cache every column runs again
        h = self.model(*self.next_inputs(), cache=self.cache)                  # (N, n_new, d)
        if self.cache is None:
            self.source = self._source_extras(h)
        elif (n := h.size(1) - (self.query is not None)) > 0:
            # y_{t-1} joins the cache; the query token is dropped
            self.cache.commit(n)
        return self.objective.decode_logprobs(self.model, h[:, -1], self.source)

    def append(self, tokens):
        self.tgt = torch.cat([self.tgt, tokens[:, None]], dim=1)

    def reorder(self, index, same_sources=False):
        """Keep rows `index`; same_sources: each row stays with its source (no source dropped)."""
        self.tgt = self.tgt.index_select(0, index)
        if self.cache is not None:
            self.reorder_cache(index, same_sources)
        if same_sources:
            return                             # source ids, lengths and states are already right
        self.src_ids = self.src_ids.index_select(0, index)
        self.src_len = self.src_len.index_select(0, index)
        if self.source is not None:
            self.source = {k: v.index_select(0, index) for k, v in self.source.items()}

    def reorder_cache(self, index, same_sources):
        """The cache keeps rows `index` (a subclass's cache may use same_sources)."""
        self.cache.reorder(index)


def ban_tokens(logp, tgt, step, eos, min_len, banned, no_repeat_ngram, ignore):
    """Forbid in place: [EOS] before min_len, the `banned` ids, tokens repeating an n-gram."""
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


# --- Greedy and beam search over one batch of sources ---------------------------------------------
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


def start_beams(dec, K):
    """Each row of dec (a source) becomes K beams, rows b * K + k -> their scores (B, K): only
    beam 0 may expand at t=0, the K copies being identical."""
    B = len(dec.src_len)
    dec.reorder(torch.arange(B, device=dec.src_ids.device).repeat_interleave(K))
    scores = torch.full((B, K), NEG_INF, device=dec.src_ids.device)
    scores[:, 0] = 0
    return scores


def best_extensions(scores, logp, eos):
    """One step's choice: scores (A, K) of each source's beams, logp (A * K, V) of their next token
    -> top (A, 2K) the best totals of one-token extensions per source, beam and tok (A, 2K) the beam
    each extends and its token, is_eos (A, 2K), live (A, K) the K best not ending in [EOS]."""
    A, K = scores.shape
    V = logp.size(-1)
    # total log-probability of every one-token extension of every beam, flattened per source
    cand = (scores[:, :, None] + logp.view(A, K, V)).view(A, K * V)
    # 2K: at most K end in [EOS], so K live ones remain
    top, idx = cand.topk(2 * K, dim=1)
    beam, tok = idx // V, idx % V
    is_eos = tok == eos
    # the live beams: the K best candidates that do not end in [EOS] (stable: keeps the order)
    rank = torch.arange(2 * K, device=scores.device)
    live = (rank + 2 * K * is_eos).argsort(dim=1)[:, :K]
    return top, beam, tok, is_eos, live


@torch.no_grad()
def beam_search(dec, K, max_len, alpha, rules):
    """Beam search of width K -> for each row of dec (a source) its finished hypotheses, best
    first. Each step keeps the top 2K extensions per source, sets aside those of its K best ending
    in [EOS] and goes on with the best K others; the cache and the history follow them."""
    B = len(dec.src_len)
    eos = rules["eos"]
    dev = dec.src_ids.device
    # rows: source b, beam k -> b * K + k
    scores = start_beams(dec, K)
    finished = [[] for _ in range(B)]
    active = list(range(B))                                    # the source of each block of K rows
    for t in range(max_len):
        A = len(active)
        logp = ban_tokens(dec.logprobs(), dec.tgt, t, **rules)                      # (A * K, V)
        top, beam, tok, is_eos, live = best_extensions(scores, logp, eos)
        row = torch.arange(A, device=dev)[:, None] * K + beam        # (A, 2K) the row extended
        live_row = row.gather(1, live)
        live_tok = tok.gather(1, live)
        live_score = top.gather(1, live)
        last = t == max_len - 1
        # finished: an [EOS] among the top K (one ranked lower is dropped: K candidates were better)
        top_c = top.tolist()
        row_c = row.tolist()
        eos_c = is_eos.tolist()
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


# --- Public API -----------------------------------------------------------------------------------
def decoding_rules(tok, min_len, no_repeat_ngram, ignore_ids, device):
    """What `ban_tokens` forbids: specials but [EOS]/[UNK], [EOS] before min_len, repeated n-grams
    (ignore words default to "." when it is in the vocab)."""
    if ignore_ids is None:
        ignore_ids = [i for i in (tok.token_to_id("."),) if i is not None]
    banned = sorted(tok.special_ids - {tok.eos_id, tok.unk_id})
    ignore = torch.tensor(list(ignore_ids), device=device, dtype=torch.long) if ignore_ids else None
    return dict(eos=tok.eos_id, min_len=min_len, no_repeat_ngram=no_repeat_ngram, ignore=ignore,
                banned=torch.tensor(banned, device=device, dtype=torch.long))


def max_source_len(model, max_len):
    """Longest source (without [SOS]/[EOS]) whose targets up to S + max_len - 1 fit max_position."""
    return model.config.max_position - max_len - 2


class Decoding(NamedTuple):
    """How generate() decodes: a Decoder (class or factory) and the two searches. READABLE, this
    file's, is the default; fast.decoding() gives the fast layer's, with the same results."""
    decoder: Callable
    greedy: Callable
    beam_search: Callable


READABLE = Decoding(Decoder, greedy, beam_search)


@torch.no_grad()
def generate(model, objective, sources, beam_size=1, max_len=64, min_len=1, length_penalty=1.0,
             no_repeat_ngram=3, ignore_ids=None, n_best=1, use_cache=True, batch_size=32,
             progress=False, decoding=READABLE):
    """Decode token-id sources -> for each, up to n_best (token_ids without the final [EOS],
    score = sum of log-probs / gnmt_penalty) pairs, best first; beam_size 1 is greedy search.
    Sources too long for max_position are cut (a warning)."""
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
    rules = decoding_rules(objective.tok, min_len, no_repeat_ngram, ignore_ids, device)
    was_training = model.training
    model.eval()
    # similar lengths share a batch: less padding
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    results = [None] * len(sources)
    bar = tqdm(total=len(sources), desc="generate", disable=not progress, unit="src")
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        dec = decoding.decoder(model, objective, [list(sources[i])[:limit] for i in chunk],
                               max_len, use_cache)
        out = (decoding.greedy(dec, max_len, length_penalty, rules) if beam_size == 1
               else decoding.beam_search(dec, beam_size, max_len, length_penalty, rules))
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
def show_summary(model, objective, example, n_tokens=48):
    """What a fine-tuning run prints at each evaluation: a source, the greedy output, the answer."""
    tok = objective.tok
    hyp = generate(model, objective, [example[0]], beam_size=1, max_len=32)[0][0][0]
    return (f"  source: {tok.decode(example[0][:n_tokens])} ...\n  model:  {tok.decode(hyp)}\n"
            f"  answer: {tok.decode(example[1])}")


@torch.no_grad()
def score_targets(model, objective, sources, targets, use_cache=True, decoder=Decoder):
    """Teacher forcing through the decoding loop: per-step log P(y_t | y_<t, src) of each target as
    given (add [EOS] to score it); tests hold it to the fine-tuning batch's (the same layout)."""
    forced = pad(targets, objective.tok.eos_id)                                # (N, T)
    dec = decoder(model, objective, sources, forced.size(1), use_cache)
    forced = forced.to(dec.src_ids.device)
    steps = []
    for t in range(forced.size(1)):
        steps.append(dec.logprobs().gather(1, forced[:, t:t + 1]).squeeze(1))
        dec.append(forced[:, t])
    logp = torch.stack(steps, dim=1)                                           # (N, T)
    return [logp[b, :len(y)] for b, y in enumerate(targets)]


def load_checkpoint(path, device="cpu"):
    """A train.py checkpoint, read as data (utils.read_checkpoint) -> (model in eval mode,
    tokenizer, seq2seq objective). A missing, foreign or mismatched file is a UsageError."""
    ckpt = read_checkpoint(path, device)
    if ckpt.get("task") == "pretrain":
        raise UsageError(f"{path} is a pre-training checkpoint (task: pretrain), not a decoder; "
                         f"fine-tune it first: python train.py --task seq2seq --init_from {path}")
    try:
        cfg = M.ModelConfig.from_dict(ckpt["model_config"])
        model = M.Transformer(cfg)
        # compiled modules and DDP wrap parameter names: strip their prefixes
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


# --- Command line ---------------------------------------------------------------------------------
PROG = "generate.py"


def read_sources(path):
    """One source a line, or jsonl with a "src" field; blank lines are kept (as "")."""
    lines = read_lines(path)
    if not str(path).endswith(".jsonl"):
        return lines
    out = []
    for n, line in enumerate(lines, start=1):
        try:
            src = json.loads(line)["src"] if line.strip() else ""
        except (json.JSONDecodeError, KeyError, TypeError):
            src = None
        if not isinstance(src, str):
            raise DataError(f"{path}:{n}: expected a JSON object with a string \"src\" field")
        out.append(src)
    return out


def check_output(path):
    """--output is no folder, and its folder exists or can be made (nothing is made here)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--output {path}: is a directory")
    # the nearest folder that exists must be a folder we may write into
    folder = next(p for p in path.parents if p.exists())
    if not folder.is_dir():
        raise UsageError(f"--output {path}: cannot make its folder ({folder} is a file)")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {path}: {folder} is not writable")


def check_args(args):
    """Every flag, before anything slow runs; a mistake is a UsageError (one line, exit 2)."""
    check_at_least(args, beam=1, max_len=1, batch_size=1, no_repeat_ngram=0)
    if not 0 <= args.min_len <= args.max_len:
        raise UsageError(f"--min_len must be between 0 and --max_len ({args.max_len}), "
                         f"got {args.min_len}")
    if not 1 <= args.n_best <= args.beam:
        raise UsageError(f"--n_best must be between 1 and --beam ({args.beam}), got {args.n_best}")
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
    p.add_argument("--input", required=True, help="one source a line, or .jsonl with a \"src\"")
    p.add_argument("--output", required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length_penalty", type=float, default=1.0)
    p.add_argument("--min_len", type=int, default=1)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--no_repeat_ngram", type=int, default=3, help="0 = off")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--n_best", type=int, default=1, help="> 1: a JSON list of {text, score} a line")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 on cards of compute capability >= 8.0, fp16 below, fp32 on a "
                        "CPU), bf16, fp16 or fp32")
    p.add_argument("--no_cache", action="store_true", help="recompute every token, every step")
    p.add_argument("--no_cuda_graph", action="store_true",
                   help="on a GPU too, the readable KV cache and search (not the CUDA graph)")
    return p.parse_args(argv)


def decoding_for(model, device, args):
    """generate.py's door into the fast layer: on CUDA with the KV cache (unless --no_cuda_graph)
    the static-shape step replayed as a CUDA graph and the search on the device, the same
    hypotheses (tests/test_fast_beam.py); elsewhere this file's readable decoder."""
    if device.type != "cuda" or args.no_cache or args.no_cuda_graph:
        return READABLE
    # imported here, at the door: the fast layer stands above this file (it imports it)
    import fast
    fast.speed_up(model, compile=False)
    return fast.decoding(graphed=True)


def run(args):
    """Check, read, decode, write: generate.py's whole job."""
    check_args(args)
    device = pick_device(args.device)
    try:
        dtype = M.device_dtype(args.dtype, device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    texts = read_sources(args.input)
    model, tok, objective = load_checkpoint(args.ckpt, device)
    decoding = decoding_for(model, device, args)
    if device.type == "cuda":
        # what this card runs of the fast layer, once (model.fast_pieces)
        print(M.describe_fast_pieces(torch.cuda.get_device_capability(device)), file=sys.stderr)
    if max_source_len(model, args.max_len) < 0:
        raise UsageError(f"--max_len {args.max_len} leaves no room for a source in this model "
                         f"(max_position {model.config.max_position})")
    # blank lines stay blank
    keep = [i for i, t in enumerate(texts) if t.strip()]
    with M.autocast(device, dtype):
        hyps = generate(model, objective, [tok.encode(texts[i]) for i in keep],
                        beam_size=args.beam, max_len=args.max_len, min_len=args.min_len,
                        length_penalty=args.length_penalty, no_repeat_ngram=args.no_repeat_ngram,
                        n_best=args.n_best, use_cache=not args.no_cache,
                        batch_size=args.batch_size, progress=True, decoding=decoding)
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
    # the fast layer imports this file as `generate`: it finds this very module, not a second copy
    sys.modules.setdefault("generate", sys.modules["__main__"])
    one_line_warnings(PROG)
    main()

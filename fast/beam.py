"""Beam and greedy search with no host synchronization inside the step loop, and on
fast.StaticDecoder the whole step in one CUDA graph: the fast layer's twins of generate.beam_search
and generate.greedy (the readable functions). tests/test_fast_beam.py and
tests/test_fast_graph_search.py hold them equal on a CPU: the same hypotheses, scores and order
(ties included), for all four objectives, on the readable cache, on fast.StaticDecoder (the
whole-step search run eagerly) and without a cache, and count the host reads inside the loop;
bench/check_cuda.py compares them on a GPU (generate.py's CUDA path runs them).

Why: generate.beam_search decides on the host. Every step it copies the top 2K candidates to the
CPU (.tolist()) and drops the finished sources from the batch; on a GPU each copy waits for the
step's kernels, so the GPU idles while the CPU decides and launches the next step (bench/RESULTS.md,
"Decoding": with the model step in a CUDA graph, 9.22 ms a step of which the GPU was busy
5.58 ms). Here:
  - rows never leave the batch: every step reorders the beams within their own source
    (dec.reorder(index, same_sources=True)); a source that is done keeps running and is ignored, so
    the shapes stay static and fast.StaticDecoder's CUDA graph serves to the end;
  - what the readable search reads on the host stays on the device, a few (B, K) tensors a step:
    the scores and beams of the [EOS] candidates among the top K, the live beams' backpointers and
    tokens;
  - the host reads them once, after the loop, and rebuilds the finished lists in the order
    generate.beam_search appends them (its final sort is stable: equal scores keep that order);
  - "is every source done?" is asked every CHECK_EVERY steps and read CHECK_LAG steps later
    (DoneCheck), so the GPU never waits for the host; the loop may run up to
    CHECK_EVERY + CHECK_LAG - 1 steps past the last source's end, steps that change nothing.
Removing the host's waits gained 2-4%: the ~130 small bookkeeping kernels a step launched one by
one from Python (the bans, topk, the reorders) held the step. So on fast.StaticDecoder (generate's
decoder on CUDA) the whole step is one function of buffers allocated once (WholeStep): the
history is a fixed (N, max_len) buffer and the step index a device tensor, the n-gram ban reads
the whole buffer (static_ban, generate.ban_tokens' twin), the records go into (max_len, B, K)
buffers at the step index; step 0 runs eagerly (a query token's step 0 has one column fewer),
every later step is one replay of one CUDA graph (StepGraph), and between replays the host only
asks DoneCheck. Beam search there runs on one cache row a source (GROUP_BEAMS,
fast.StaticCache.group_beams): one row a beam read each source's keys and values K times a step
and copied every target slot at every reorder; in one row a source the K beams' new tokens are
K n columns of that row, each beam sees the slots its history names, and a reorder moves no keys
(an H100's beam-5 step: 5.97 -> 2.41 ms of GPU time for unilm, bench/RESULTS.md, "Decoding").
WHOLE_STEP off keeps the kernel-by-kernel loop there too (bench/bench_generate.py's row,
one row a beam); on the readable cache and without a cache that loop always runs.
Left out: a graph for the readable cache or for no cache (their shapes grow every step); dropping
the finished sources' rows (they run on, ignored, to keep the shapes); CUDA graphs for step 0 and
for the source's pass (each runs once a batch); a graph kept across batches (every batch captures
its own: the buffers' addresses are the batch's).
"""
import torch

import generate as G
from fast.decoder import StaticDecoder

NEG_INF = float("-inf")
CHECK_EVERY = 4           # steps between two asks "is every source done?"
CHECK_LAG = 2             # steps between an ask and its read: the GPU's queue never runs dry
# on fast.StaticDecoder, the whole step (model and bookkeeping) in one CUDA graph;
# False: the model step's graph alone and the bookkeeping kernel by kernel. Its eager twin equals
# the readable search (tests/test_fast_graph_search.py); the captured graph does on a GPU
# (`python bench/check_cuda.py decode`)
WHOLE_STEP = True
# beam search on one cache row a source (fast.StaticCache.group_beams); False: one row a beam, each
# with its own copy of the source's keys and values (bench/bench_generate.py's row before)
GROUP_BEAMS = True


class DoneCheck:
    """Whether every source is done: asked on the device every `every` steps, read on the host `lag`
    steps later. The copy to the host queues behind the step's kernels; when it is read, the GPU
    still has the `lag` steps in between to run, so the read never leaves it idle (on a CPU it is a
    plain read). The search stops at most every + lag - 1 steps after its last source is done."""

    def __init__(self, device, every, lag):
        self.every, self.lag = every, lag
        self.device = device
        self.cuda = device.type == "cuda"
        self.asked = None                        # (step, host flag, CUDA event) of the open ask

    def __call__(self, t, done):
        """After step t, with done (B,) bool on the device -> True when an ask saw every source
        done."""
        if self.asked is not None and t >= self.asked[0] + self.lag:
            if self.read():
                return True
            self.asked = None
        if self.asked is None and (t + 1) % self.every == 0:
            flag = torch.empty((), dtype=torch.bool, pin_memory=self.cuda)
            # pinned memory: the copy runs in the stream's order, the host goes on at once
            flag.copy_(done.all(), non_blocking=True)
            event = None
            if self.cuda:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self.device))
            self.asked = (t, flag, event)
        return False

    def read(self):
        _, flag, event = self.asked
        if event is not None:
            event.synchronize()                  # the GPU is `lag` steps past it, or about to be
        return bool(flag)


@torch.no_grad()
def beam_search(dec, K, max_len, alpha, rules):
    """generate.beam_search (its readable twin: the same arguments and the same result) with no host
    sync a step. Each step keeps the top 2K extensions per source, records the [EOS] ones among the
    top K and goes on with the best K others; every source's rows stay in the batch."""
    if WHOLE_STEP and isinstance(dec, StaticDecoder):
        return graph_beam_search(dec, K, max_len, alpha, rules)
    B = len(dec.src_len)
    eos = rules["eos"]
    dev = dec.src_ids.device
    # rows: source b, beam k -> b * K + k
    scores = G.start_beams(dec, K)
    first = torch.arange(B, device=dev)[:, None] * K                 # (B, 1) each source's beam 0
    n_finished = torch.zeros(B, dtype=torch.long, device=dev)
    steps = []                          # per step: what the host reads after the loop
    check = DoneCheck(dev, CHECK_EVERY, CHECK_LAG)
    for t in range(max_len):
        logp = G.ban_tokens(dec.logprobs(), dec.tgt, t, **rules)                    # (B * K, V)
        scores, *record = choose(scores, logp, eos)
        fin, _, live_beam, live_tok = record
        steps.append(record)
        # early stop: K finished hypotheses end a source (its rows run on, ignored)
        n_finished += (fin > NEG_INF).sum(dim=1)
        if t == max_len - 1 or check(t, n_finished >= K):
            break
        # the cache and the history follow the live beams; each row stays with its source
        dec.reorder((first + live_beam).flatten(), same_sources=True)
        dec.append(live_tok.flatten())
    return finished_lists([torch.stack(x) for x in zip(*steps)], scores, K, max_len, alpha)


def choose(scores, logp, eos):
    """One step's choice on the device, as generate.beam_search's (best_extensions: top 2K
    extensions, the K best live ones): scores (B, K), logp (B * K, V) -> the live beams' new scores
    (B, K) and the step's record, each (B, K): the finished scores among the top K (-inf where no
    [EOS]), their beams, the live beams' backpointers and tokens."""
    K = scores.size(1)
    top, beam, tok, is_eos, live = G.best_extensions(scores, logp, eos)
    fin = top[:, :K].masked_fill(~is_eos[:, :K], NEG_INF)
    return top.gather(1, live), fin, beam[:, :K], beam.gather(1, live), tok.gather(1, live)


def finished_lists(records, last_scores, K, max_len, alpha):
    """The host's part, once: the device records of every step run, (T, B, K) each: finished
    scores, their beams, the live beams' backpointers and tokens -> for each source its finished
    hypotheses, appended in generate.beam_search's order, then sorted as it sorts them (stable)."""
    fin, fin_beam, parent, token = (x.tolist() for x in records)                  # (T, B, K)
    last = last_scores.tolist()                                                    # (B, K)

    def history(t, b, k):
        """The tokens of source b's beam k before step t (t of them): backpointers to step 0."""
        ids = []
        for s in range(t - 1, -1, -1):
            ids.append(token[s][b][k])
            k = parent[s][b][k]
        return ids[::-1]

    out = []
    for b in range(len(last)):
        finished = []
        for t in range(len(fin)):
            lp = G.gnmt_penalty(t + 1, alpha)
            for c in range(K):
                if fin[t][b][c] > NEG_INF:
                    finished.append((history(t, b, fin_beam[t][b][c]), fin[t][b][c] / lp))
            if t == max_len - 1:
                # max_len reached: live beams finish as they are
                for k in range(K):
                    if last[b][k] > NEG_INF:
                        finished.append((history(t + 1, b, k), last[b][k] / lp))
            elif len(finished) >= K:
                break
        out.append(sorted(finished, key=lambda h: -h[1]))
    return out


@torch.no_grad()
def greedy(dec, max_len, alpha, rules):
    """generate.greedy (its readable twin: the same arguments and result) with no host sync a step:
    finished rows stay in the batch, the tokens and running totals are read once, after the loop."""
    if WHOLE_STEP and isinstance(dec, StaticDecoder):
        return graph_greedy(dec, max_len, alpha, rules)
    N = len(dec.src_len)
    dev = dec.src_ids.device
    total = torch.zeros(N, device=dev)
    done = torch.zeros(N, dtype=torch.bool, device=dev)
    steps = []
    check = DoneCheck(dev, CHECK_EVERY, CHECK_LAG)
    for t in range(max_len):
        best, tok = G.ban_tokens(dec.logprobs(), dec.tgt, t, **rules).max(dim=-1)
        total = total + best
        dec.append(tok)
        steps.append((tok, total))
        done |= tok == rules["eos"]
        if check(t, done):
            break
    tokens, totals = (torch.stack(x) for x in zip(*steps))
    return greedy_lists(tokens, totals, rules["eos"], max_len, alpha)


def greedy_lists(tokens, totals, eos, max_len, alpha):
    """The host's part of greedy, once: every step's tokens and running totals (T, N) -> for each
    row [(ids, score)] as generate.greedy makes it."""
    tokens, totals = tokens.tolist(), totals.tolist()
    out = []
    for r in range(len(tokens[0])):
        # a row ends at its first [EOS], or at max_len
        end = next((t for t in range(len(tokens)) if tokens[t][r] == eos), max_len - 1)
        # with its [EOS], unless max_len cut it
        ids = [tokens[t][r] for t in range(end + 1)]
        score = totals[end][r] / G.gnmt_penalty(len(ids), alpha)
        out.append([(ids[:-1] if ids[-1] == eos else ids, score)])
    return out


# --------------------------------------------------------------------------------------------------
# The whole step in one CUDA graph: model, bans, choice, records, reorders


def static_ban(logp, hist, t, eos, min_len, banned, no_repeat_ngram, ignore):
    """generate.ban_tokens (its readable twin: the same tokens forbidden) with static shapes: the
    history is the whole (N, max_len) buffer, of which the first t columns are written, t a device
    scalar (tests/test_fast_graph_search.py holds the two equal at every t)."""
    logp.index_fill_(1, banned, NEG_INF)
    # [EOS] before min_len
    logp[:, eos].masked_fill_(t < min_len, NEG_INF)
    n = no_repeat_ngram
    # the readable rule starts once n tokens are written: never when max_len - 1 < n
    if not n or hist.size(1) <= n:
        return logp
    win = hist.unfold(1, n, 1)                        # (N, W, n): every n-gram of the buffer
    start = torch.arange(win.size(1), device=hist.device)
    # the last n - 1 tokens written (columns t - n + 1 .. t - 1; clamped before step n)
    back = (t - n + 1 + torch.arange(n - 1, device=hist.device)).clamp(min=0)
    tail = hist[:, back]                              # (N, n - 1)
    # n-grams written so far that start with the tail
    hit = (start + n <= t) & (win[..., :-1] == tail[:, None]).all(-1)           # (N, W)
    if ignore is not None:
        # UniLM: an n-gram holding an ignore word may repeat (no isin: it syncs on a GPU)
        hit &= ~(win[..., None] == ignore).any(-1).any(-1)
    # adding -inf bans, adding 0 changes nothing, and two windows may end in the same token
    add = torch.zeros_like(hit, dtype=logp.dtype).masked_fill_(hit, NEG_INF)
    return logp.scatter_add_(1, win[..., -1], add)


class StepGraph:
    """fn() captured as one CUDA graph at its first call, replayed at every later call. fn is a
    whole search step: it reads and writes only tensors allocated before it, so a replay is the
    step. The first call runs fn for real on a side stream (GraphedStep's warm-up: cuBLAS handles,
    compilation, allocations happen outside the capture), then captures it (a capture runs
    nothing). Twin: fn called eagerly (tests/test_fast_graph_search.py stands an eager StepGraph in
    on a CPU; bench/check_cuda.py replays the real one)."""

    def __init__(self, fn, device):
        self.fn = fn
        self.device = device
        self.graph = None

    def __call__(self):
        if self.graph is not None:
            self.graph.replay()
            return
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=side):
                self.fn()


class WholeStep:
    """The state of a search on fast.StaticDecoder, every tensor allocated once, and its step:
    blocks, decode_logprobs, static_ban, the choice, the records, the reorders. Nothing a step runs
    reads a Python number that changes from step to step (the step index t is a device tensor), so
    from the second step on one CUDA graph replays it (StepGraph); step 0 runs eagerly (a query
    token's step 0 has one column fewer). K = 0: greedy. Twins: generate.beam_search and
    generate.greedy (tests/test_fast_graph_search.py, tests/test_fast_beam.py)."""

    def __init__(self, dec, K, max_len, rules):
        self.dec, self.K, self.rules = dec, K, rules
        dev = dec.src_ids.device
        B = len(dec.src_len)
        if K:
            # one cache row a source, the beams' target slots side by side: a step reads the
            # source's keys and values once, not K times (fast.StaticCache.group_beams)
            if GROUP_BEAMS:
                dec.cache.group_beams(K)
            # rows: source b, beam k -> b * K + k
            self.scores = G.start_beams(dec, K)                                   # (B, K)
            self.first = torch.arange(B, device=dev)[:, None] * K                 # (B, 1)
            self.n_finished = torch.zeros(B, dtype=torch.long, device=dev)
            # per step: finished scores, their beams, the live beams' backpointers and tokens
            self.records = [torch.full((max_len, B, K), NEG_INF, device=dev)] + [
                torch.zeros(max_len, B, K, dtype=torch.long, device=dev) for _ in range(3)]
        else:
            self.total = torch.zeros(B, device=dev)
            # per step: the tokens and the running totals
            self.records = [torch.zeros(max_len, B, dtype=torch.long, device=dev),
                            torch.zeros(max_len, B, device=dev)]
        N = len(dec.src_len)                                    # rows: B * K, or B for greedy
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)                # per source
        self.t = torch.zeros((), dtype=torch.long, device=dev)                   # the step index
        self.hist = torch.zeros(N, max_len, dtype=torch.long, device=dev)       # tokens so far
        # y_{t-1}: [SOS] at t = 0 without a query token
        self.last = torch.full((N,), dec.sos, dtype=torch.long, device=dev)
        self.query = None
        if dec.query is not None:
            self.query = torch.full((N, 1), dec.query, dtype=torch.long, device=dev)

    def logprobs(self, first):
        """StaticDecoder.logprobs from the buffers -> (N, V): the new columns [y_{t-1}, query]
        ([query] alone at t = 0) or [y_{t-1}] ([SOS] at t = 0), embedded, run, committed."""
        dec = self.dec
        cache = dec.cache
        ids = self.last[:, None]                                               # (N, 1)
        if self.query is not None:
            ids = self.query if first else torch.cat([ids, self.query], dim=1)  # (N, n_new)
        logp = dec.step(*dec.new_columns(ids))
        # y_{t-1} joins the cache (on the device only: cache.n is the host's, left behind); the
        # query token is dropped
        cache.fill += ids.size(1) - (self.query is not None)
        return static_ban(logp, self.hist, self.t, **self.rules)

    def step(self, first=False):
        """One step of the search, in place; self.done says which sources (rows) are done."""
        if self.K:
            self.beam_step(first)
        else:
            self.greedy_step(first)
        self.t += 1

    def record(self, *values):
        """values[i] into self.records[i] at step t."""
        at = self.t.view(1)
        for buf, x in zip(self.records, values):
            buf.index_copy_(0, at, x[None])

    def beam_step(self, first):
        scores, *record = choose(self.scores, self.logprobs(first), self.rules["eos"])
        fin, _, live_beam, live_tok = record
        self.scores.copy_(scores)
        self.record(*record)
        # early stop: K finished hypotheses end a source (its rows run on, ignored)
        self.n_finished += (fin > NEG_INF).sum(dim=1)
        torch.ge(self.n_finished, self.K, out=self.done)
        # the cache and the history follow the live beams; each row stays with its source
        index = (self.first + live_beam).flatten()
        self.dec.cache.reorder(index, same_sources=True, static=True)
        self.hist.copy_(self.hist.index_select(0, index))
        self.append(live_tok.flatten())

    def greedy_step(self, first):
        best, tok = self.logprobs(first).max(dim=-1)
        self.total += best
        self.record(tok, self.total)
        self.done |= tok == self.rules["eos"]
        self.append(tok)

    def append(self, tok):
        """y_t (N,) into the history's column t and the next step's input."""
        self.hist.index_copy_(1, self.t.view(1), tok[:, None])
        self.last.copy_(tok)

    def run(self, max_len, graphed):
        """Step 0 eagerly, then the same step replayed (graphed: a CUDA graph) until max_len or
        until DoneCheck sees every source done -> the number of steps run."""
        device = self.dec.src_ids.device
        check = DoneCheck(device, CHECK_EVERY, CHECK_LAG)
        later = StepGraph(self.step, device) if graphed else self.step
        for t in range(max_len):
            if t == 0:
                self.step(first=True)
            else:
                later()
            if t == max_len - 1 or check(t, self.done):
                return t + 1


def graph_beam_search(dec, K, max_len, alpha, rules):
    """fast.beam_search on a decoder that runs fast.StaticDecoder: the whole step in one CUDA graph
    where dec.graphed (its eager twin elsewhere). Twin: generate.beam_search."""
    search = WholeStep(dec, K, max_len, rules)
    T = search.run(max_len, dec.graphed)
    return finished_lists([r[:T] for r in search.records], search.scores, K, max_len, alpha)


def graph_greedy(dec, max_len, alpha, rules):
    """fast.greedy on a decoder that runs fast.StaticDecoder, as graph_beam_search. Twin:
    generate.greedy."""
    search = WholeStep(dec, 0, max_len, rules)
    T = search.run(max_len, dec.graphed)
    tokens, totals = (r[:T] for r in search.records)
    return greedy_lists(tokens, totals, rules["eos"], max_len, alpha)

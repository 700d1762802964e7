"""Beam and greedy search with no host synchronization inside the step loop: the fast layer's twins
of generate.beam_search and generate.greedy (the readable functions). tests/test_fast_beam.py holds
them equal on a CPU: the same hypotheses, scores and order (ties included), for all four objectives,
on the readable cache, on fast.StaticStep and without a cache, and counts the host reads inside the
loop; bench/check_cuda.py compares them on a GPU (generate's CUDA-graph path runs them).

Why: generate.beam_search decides on the host. Every step it copies the top 2K candidates to the
CPU (.tolist()) and drops the finished sources from the batch; on a GPU each copy waits for the
step's kernels, so the GPU idles while the CPU decides and launches the next step (bench/RESULTS.md,
"Decoding, beam 5": with the model step in a CUDA graph, 9.22 ms a step of which the GPU was busy
5.58 ms). Here:
  - rows never leave the batch: every step reorders the beams within their own source
    (dec.reorder(index, same_sources=True)); a source that is done keeps running and is ignored, so
    the shapes stay static and fast.StaticStep's CUDA graph serves to the end;
  - what the readable search reads on the host stays on the device, a few (B, K) tensors a step:
    the scores and beams of the [EOS] candidates among the top K, the live beams' backpointers and
    tokens;
  - the host reads them once, after the loop, and rebuilds the finished lists in the order
    generate.beam_search appends them (its final sort is stable: equal scores keep that order);
  - "is every source done?" is asked every CHECK_EVERY steps and read CHECK_LAG steps later
    (DoneCheck), so the GPU never waits for the host; the loop may run up to
    CHECK_EVERY + CHECK_LAG - 1 steps past the last source's end, steps that change nothing.
Left out: the bookkeeping (ban_tokens, topk, the reorders) is launched kernel by kernel, not
captured in a CUDA graph.
"""
import torch

NEG_INF = float("-inf")
CHECK_EVERY = 4           # steps between two asks "is every source done?"
CHECK_LAG = 2             # steps between an ask and its read: the GPU's queue never runs dry


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
    # generate.py imports this package: its helpers are looked up when a search runs
    import generate as G
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
        # the same choice as generate.beam_search's: top 2K extensions, the K best live ones
        top, beam, tok, is_eos, live = G.best_extensions(scores, logp, eos)
        live_beam = beam.gather(1, live)
        live_tok = tok.gather(1, live)
        scores = top.gather(1, live)
        # finished: an [EOS] among the top K, its score; -inf where none
        fin = top[:, :K].masked_fill(~is_eos[:, :K], NEG_INF)
        steps.append((fin, beam[:, :K], live_beam, live_tok))
        # early stop: K finished hypotheses end a source (its rows run on, ignored)
        n_finished += (fin > NEG_INF).sum(dim=1)
        if t == max_len - 1 or check(t, n_finished >= K):
            break
        # the cache and the history follow the live beams; each row stays with its source
        dec.reorder((first + live_beam).flatten(), same_sources=True)
        dec.append(live_tok.flatten())
    return finished_lists(steps, scores, K, max_len, alpha)


def finished_lists(steps, last_scores, K, max_len, alpha):
    """The host's part, once: the device records of every step -> for each source its finished
    hypotheses, appended in generate.beam_search's order, then sorted as it sorts them (stable)."""
    import generate as G
    fin, fin_beam, parent, token = (torch.stack(x).tolist() for x in zip(*steps))  # (T, B, K)
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
    import generate as G
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
    return greedy_lists(steps, rules["eos"], max_len, alpha)


def greedy_lists(steps, eos, max_len, alpha):
    """The host's part of greedy, once: every step's tokens and running totals -> for each row
    [(ids, score)] as generate.greedy makes it."""
    import generate as G
    tokens = torch.stack([tok for tok, _ in steps]).tolist()                      # (T, N)
    totals = torch.stack([total for _, total in steps]).tolist()
    out = []
    for r in range(len(tokens[0])):
        # a row ends at its first [EOS], or at max_len
        end = next((t for t in range(len(tokens)) if tokens[t][r] == eos), max_len - 1)
        # with its [EOS], unless max_len cut it
        ids = [tokens[t][r] for t in range(end + 1)]
        score = totals[end][r] / G.gnmt_penalty(len(ids), alpha)
        out.append([(ids[:-1] if ids[-1] == eos else ids, score)])
    return out

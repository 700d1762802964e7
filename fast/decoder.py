"""Decoding with static shapes, replayed as a CUDA graph: the fast layer's decoder, a subclass of
generate.Decoder (StaticDecoder), on a preallocated cache (StaticCache, model.KVCache's twin).
fast/beam.py's searches run on it; fast.decoding() hands both to generate(). Each piece names its
readable twin and the test that holds them equal.
Left out: a graph for the source's pass and for step 0 (each runs once a batch); paged caches.
"""
import torch
import torch.nn.functional as F

import generate as G
from objectives.masks import CTX, ORIG, PAD, PSEUDO, may_attend


class StaticCache:
    """model.KVCache (its twin) with preallocated buffers (N, H, capacity, D) per layer and every
    shape fixed, which a CUDA graph needs.

    model.KVCache concatenates, which copies the whole cache in every layer at every step (on an
    H100 that was 3/4 of the decoding time at base size). Here the new keys, values and positions
    are written at the fill index, a DEVICE tensor that commit() advances in place, and every layer
    attends to the WHOLE buffer: the step's mask hides the slots not written yet. `n` is the same
    count on the host, for the bookkeeping outside the step (len, beam reorders). A beam reorder
    that keeps every row with its source (`same_sources`) moves only the target part: the beams of
    one source share the source's keys and values.

    group_beams(K) (fast/beam.py's WholeStep, beam search) turns it into one row a SOURCE: the
    source's slots once, then K columns of target slots side by side (column k's at S + k T, T =
    capacity - S). The K beams' new columns are then K n columns of their source's row
    (StaticDecoder groups them), and a step reads the source's keys once instead of K times. A
    beam reorder then moves nothing: column k's slot of step s, written at step s, is never written
    again, so a beam's history is a list of columns, one a step (`anc`, its ancestors), and its
    queries see the slots that list names (sees()). One row a beam copies every target slot at
    every reorder.
    """

    def __init__(self, n_layer, capacity, n_src, device):
        self.k = [None] * n_layer            # each (N, H, capacity, D)
        self.v = [None] * n_layer
        self.pos = None                      # (N, capacity) position id of every slot
        self.capacity = capacity
        self.n_src = n_src
        self.n = 0
        self.fill = torch.zeros((), dtype=torch.long, device=device)
        self.slots = None
        # K beams a row (group_beams): column k's slots at S + k T
        self.beams = 1
        self.T = capacity - n_src            # target slots of one column (with the query's)

    def group_beams(self, K):
        """One row a source from here on, rows (B, H, S + K T, D): the source's keys and values,
        written already, stay in place; K columns of target slots follow (empty, as every target
        slot is before a beam search's first step), column k first written by beam k."""
        assert self.n == self.n_src, "group_beams: before the first target token only"
        self.beams = K
        self.capacity = self.n_src + K * self.T
        wider = (K - 1) * self.T
        self.k = [F.pad(b, (0, 0, 0, wider)) for b in self.k]
        self.v = [F.pad(b, (0, 0, 0, wider)) for b in self.v]
        self.pos = F.pad(self.pos, (0, wider))
        # anc[b, k, s]: the column holding beam k's target slot s (its own, until a reorder)
        own = torch.arange(K, device=self.fill.device)[:, None]                      # (K, 1)
        self.anc = own.expand(self.k[0].size(0), K, self.T).contiguous()             # (B, K, T)

    def sees(self, slots):
        """Which slots the queries at `slots` (K n,) of a grouped row may see for their beam:
        the source's, and of the target slots the one its history names at each step ->
        (B, K n, capacity) bool."""
        S, T = self.n_src, self.T
        j = torch.arange(self.capacity, device=slots.device)
        column, step_slot = (j - S).clamp(min=0) // T, (j - S).clamp(min=0) % T  # (capacity,)
        anc = self.anc[:, (slots - S) // T]                                       # (B, K n, T)
        # (B, K n, capacity)
        named = anc.gather(2, step_slot.expand(*anc.shape[:2], -1)) == column
        return named | (j < S)

    def new_slots(self, n):
        """The slots of this step's n new columns of each beam, beam-major (K n,): fill, fill + 1,
        ... in column 0's target slots, the same in column 1's (T further), ... (beam k writes
        column k)."""
        cols = self.fill + torch.arange(n, device=self.fill.device)                  # (n,)
        beam = torch.arange(self.beams, device=self.fill.device)[:, None] * self.T  # (K, 1)
        return (cols[None] + beam).flatten()

    def __len__(self):
        return self.n

    def key_positions(self, position_ids):
        """Write the new tokens' positions (N, L) at their slots -> every slot's position
        (N, capacity). encode calls this once, before the layers."""
        if self.pos is None:
            self.pos = position_ids.new_zeros(position_ids.size(0), self.capacity)
        # this forward's slots: fill, fill + 1, ... (of each beam, grouped)
        self.slots = self.new_slots(position_ids.size(1) // self.beams)
        self.pos.index_copy_(1, self.slots, position_ids)
        return self.pos

    def layer(self, i, k_new, v_new):
        if self.k[i] is None:
            shape = (*k_new.shape[:2], self.capacity, k_new.size(3))
            self.k[i] = k_new.new_zeros(shape)
            self.v[i] = k_new.new_zeros(shape)
        # written in place, uncommitted until commit()
        self.k[i].index_copy_(2, self.slots, k_new)
        self.v[i].index_copy_(2, self.slots, v_new)
        return self.k[i], self.v[i]                                # (N, H, capacity, D)

    def commit(self, n):
        # keys, values and positions are already in place; a dropped query's slot is overwritten
        # by the next step
        self.n += n
        self.fill += n

    def reorder(self, index, same_sources=False, static=False):
        """Beam search: keep batch rows `index` (N',). static (with same_sources): move every target
        slot, written or not, so that the shapes never change (fast/beam.py's whole-step graph,
        where the host's count n does not follow the steps); the slots past the fill index are
        overwritten before any step reads them."""
        if self.beams > 1 and not same_sources:
            # the rows becoming beams (generate.start_beams): a grouped row holds them already
            assert self.n == self.n_src, "a grouped cache keeps every source"
            return
        if self.beams > 1:
            # one row a source: beam k of source b continues beam index[b K + k] % K; nothing
            # moves, beam k takes that beam's history of columns
            assert static, "a grouped cache keeps its shapes"
            K, T = self.beams, self.T
            take = (index % K).view(-1, K, 1).expand(-1, -1, T)                  # (B, K, T)
            anc = self.anc.gather(1, take)
            # the slots from the fill index on are written from now on, each beam in its own column
            ahead = torch.arange(T, device=index.device) >= self.fill - self.n_src   # (T,)
            own = torch.arange(K, device=index.device)[:, None]
            self.anc.copy_(torch.where(ahead, own, anc))
            return
        if same_sources:
            # only the target part differs between the beams of one source
            end = self.capacity if static else self.n
            for buf in self.k + self.v:
                buf[:, :, self.n_src:end] = buf[:, :, self.n_src:end].index_select(0, index)
            return
        self.k = [b.index_select(0, index) for b in self.k]
        self.v = [b.index_select(0, index) for b in self.v]
        self.pos = self.pos.index_select(0, index)


class GraphedStep:
    """fn(*inputs) -> tensor, recorded once as a CUDA graph and replayed: one launch for a whole
    decoding step instead of one per kernel (at base size several hundred kernels, whose launches
    cost the CPU milliseconds for well under a millisecond of GPU work). Twin: fn run eagerly
    (tests/test_fast.py stands an eager fn in for the graph; bench/check_cuda.py replays it).

    torch.cuda.graph's documented pattern: fn runs once on a side stream first (cuBLAS handles,
    autotuning, torch.compile happen outside the capture), then it is captured on static copies of
    the inputs. A call copies its inputs into them, replays, and returns a copy of the static
    output; fn's writes into the cache replay too. The graph holds the addresses of every tensor fn
    reads or writes: it is valid only while none of them is reallocated
    (StaticDecoder.reorder_cache).
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


def slot_mask(q_kind, q_step, q_slot, k_kind, k_step):
    """masks.may_attend between queries (N, n) at cache slots q_slot (n,) and every slot of the
    cache (N, capacity) -> (N, n, capacity). A padding query sees its own slot (as mask_mod)."""
    j = torch.arange(k_kind.size(1), device=k_kind.device)
    same = (q_slot[:, None] == j)[None]                                 # (1, n, capacity)
    allowed = may_attend(q_kind[..., None], q_step[..., None],          # queries (N, n, 1)
                         k_kind[:, None], k_step[:, None], same)        # keys (N, 1, capacity)
    return allowed | ((q_kind == PAD)[..., None] & same)


class StaticDecoder(G.Decoder):
    """generate.Decoder with every shape of its cached step fixed, replayed as a CUDA graph where
    `graphed`. Twin: generate.Decoder on model.KVCache (tests/test_fast.py: the same tokens and
    scores for all four objectives, greedy and beam; bench/check_cuda.py with the graph on a GPU).

    The cache is a StaticCache of capacity S + max_len + 1 (source, target, query). A step's new
    columns ([y_{t-1}, query] or [y_{t-1}]) are described by kind and step per cache slot, the same
    description generate.Decoder gives the readable path, and masks.may_attend makes their mask;
    nothing the step runs reads a Python number that changes from step to step. Embedding runs
    outside the graph; beam reorders and the search stay outside too, unless the search is
    fast/beam.py's WholeStep, which calls step() inside its own graph of the whole search step.
    """

    def __init__(self, model, objective, sources, max_len, use_cache=True, graphed=False):
        if not use_cache:
            raise ValueError("StaticDecoder is a KV cache: generate.Decoder runs use_cache=False")
        if graphed and next(model.parameters()).device.type != "cuda":
            raise ValueError("graphed=True replays a CUDA graph: it needs a CUDA device "
                             "(graphed=False runs the same step eagerly)")
        self.graphed = graphed
        self.graph = None                      # the GraphedStep, captured at the first graphed step
        super().__init__(model, objective, sources, max_len, use_cache)

    def start_cache(self, max_len):
        """The source's pass, into a StaticCache of capacity S + max_len + 1."""
        self.cache = StaticCache(self.model.config.n_layer, self.S + max_len + 1, self.S,
                                 self.src_ids.device)
        ids, pos, seg, _ = self._inputs(0, with_target=False)
        last = torch.tensor(self.S - 1, device=ids.device)
        kind, step = self.slot_kinds(last)
        cols = torch.arange(self.S, device=ids.device)
        mask = slot_mask(kind[:, :self.S], step[:, :self.S], cols, kind, step)
        h = self.model(ids, pos, seg, mask, cache=self.cache)
        self.cache.commit(self.S)
        self.source = self._source_extras(h)

    def slot_kinds(self, last):
        """kind and step (N, capacity) of every cache slot while slot `last` (a device scalar) is
        the newest column: the source's, the target's written so far, the query at `last`. On a
        grouped cache (K columns of target slots a row): (B, capacity), each target slot as the
        slot it is in its column, `last` the newest in column 0."""
        cache, K, S = self.cache, self.cache.beams, self.S
        j = torch.arange(cache.capacity, device=self.src_ids.device)
        src_len = self.src_len[::K]                                     # (N / K,) one a source
        kind = torch.where(j < src_len[:, None], CTX, PAD)             # (N / K, capacity)
        j = torch.where(j >= S, S + (j - S) % cache.T, j)
        target = (j >= S) & (j <= last)
        kind = torch.where(target, ORIG, kind)
        if self.query is not None:
            kind = torch.where(target & (j == last), PSEUDO, kind)
        # target slot S + i holds the token of step i + 1 (generate.Decoder._layout)
        step = (j - S + 1).clamp(min=0).expand_as(kind)
        return kind, step

    @torch.no_grad()
    def logprobs(self):
        """Decoder.logprobs with static shapes: the new columns' inputs are built from the cache's
        fill index, src_len and the last tokens, not from the whole sequence; step() runs them,
        replayed as a CUDA graph from the second step on where self.graphed."""
        # the target columns not in the cache yet: [y_{t-1}, query] ([query] alone at t = 0), or
        # [y_{t-1}] ([SOS] at t = 0)
        ids = self._target_part()[:, len(self.cache) - self.S:]              # (N, n_new)
        # embedded outside the graph (as measured; embed's position check, which reads the GPU
        # and so cannot be captured, runs on CPU tensors only)
        x, pos, cols = self.new_columns(ids)
        # t = 0 runs eagerly: with a query token it has one column fewer than the later steps
        if self.graphed and self.tgt.size(1) > 0:
            if self.graph is None:
                self.graph = GraphedStep(self.step, x, pos, cols)
            logp = self.graph(x, pos, cols)
        else:
            logp = self.step(x, pos, cols)
        # y_{t-1} joins the cache; the query token is dropped
        self.cache.commit(ids.size(1) - (self.query is not None))
        return logp

    def new_columns(self, ids):
        """The new columns' token ids (N, n_new) -> their embeddings (N, n_new, d), positions
        (N, n_new) and cache slots (n_new,), from the cache's fill index and src_len alone."""
        cols = self.cache.fill + torch.arange(ids.size(1), device=ids.device)  # (n_new,) slots
        # a target token of step r (slot S + r - 1) sits at position S_b + r - 1
        pos = self.src_len[:, None] + (cols - self.S)                          # (N, n_new)
        return self.model.embed(ids, pos, torch.full_like(ids, self.seg_tgt)), pos, cols

    def step(self, x, pos, cols):
        """The blocks over the embedded new columns x (N, n_new, d) at positions pos (N, n_new) and
        cache slots cols (n_new,), attending to the whole cache, then decode_logprobs -> (N, V).
        Every shape is the same at every step (GraphedStep records this)."""
        kind, step = self.slot_kinds(cols[-1])
        K = self.cache.beams
        if K > 1:
            # one row a source: the K beams' new columns are K n columns of their source's row
            N, n, d = x.shape
            x, pos = x.reshape(N // K, K * n, d), pos.reshape(N // K, K * n)
            cols = self.cache.new_slots(n)                                     # (K n,)
        # (N, n_new, capacity); grouped: (B, K n_new, capacity)
        mask = slot_mask(kind[:, cols], step[:, cols], cols, kind, step)
        if K > 1:
            # a beam sees the source and, of the target slots, its own history's
            mask &= self.cache.sees(cols)
        h = self.model.encode(x, pos, mask, self.cache)                        # (N, n_new, d)
        h = h.reshape(-1, h.size(1) // K, h.size(2))                           # one row a beam
        return self.objective.decode_logprobs(self.model, h[:, -1], self.source)

    def reorder_cache(self, index, same_sources):
        self.cache.reorder(index, same_sources)
        if not same_sources and self.graph is not None:
            # Sources finished: the cache was reallocated under the graph, so the graph goes and
            # the step runs eagerly (the same numbers) from here on. Rows only ever leave, so a
            # graph is never replayed once its rows change, and a new graph per set of rows costs a
            # warm-up step plus a capture at every change: a loss when sources finish a step or two
            # apart. Eagerly, a batch costs at most one capture (min_len = max_len keeps every row).
            self.graph = None
            self.graphed = False

"""The one Transformer backbone every objective runs on: a BERT-sized encoder in nanoGPT style
(token + absolute position + segment embeddings, pre-LN blocks, a final LayerNorm): h = model(ids,
positions, segments, attn_mask), (B, L, d); its heads apart: lm_logits(h), tied to the embedding,
nsp_logits(h[:, 0]), UniLM's next sentence, copy_head, PALM's pointer-generator (Eq. 2-8).

Position ids are explicit ([P] and [ATTN] reuse their token's); the mask is a `Mask`. Here too:
`attention()` (naive and sdpa), the relative position bias (UniLMv2 4.1), the readable `KVCache`.
The GPU layer fast/ is reached by `attn_impl="flex"` and `fast.speed_up(model)` (on a CPU only
with train.py's --compile true).
docs/model.md tells the longer story. Left out: rotary embeddings, GQA, MoE; pre-LN, where the
papers' BERT is post-LN.
"""
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Union

import torch
import torch.nn as nn
import torch.nn.functional as F

import fast
from objectives.masks import MaskSpec

# attn_mask: the dense (B, L, L) or (L, L) bool tensor, or the mask described (kind, step)
Mask = Union[torch.Tensor, MaskSpec]


def setting(default, help):
    """A dataclass field with a one-line description (train.py --help prints it)."""
    return field(default=default, metadata={"help": help})


@dataclass
class ModelConfig:
    vocab_size: int = setting(8192, "tokens in the vocabulary (train.py: the tokenizer's)")
    n_layer: int = setting(4, "Transformer blocks")
    n_head: int = setting(4, "attention heads per block")
    n_embd: int = setting(256, "model width d")
    ffn_dim: int = setting(1024, "inner width of the feed-forward layer")
    max_position: int = setting(512, "absolute position table size: the longest sequence")
    n_segment: int = setting(6, "segment embeddings (UniLM's 6 LM identifiers, 2.1)")
    dropout: float = setting(0.1, "dropout on embeddings, attention weights and residual branches")
    rel_pos_buckets: int = setting(0, "relative position bias buckets: 0 = off; UniLMv2 (4.1): 32")
    rel_pos_max_distance: int = setting(128, "distances beyond this share the last bucket")
    attn_impl: str = setting("sdpa", "attention: naive (written out) | sdpa | flex (CUDA only)")
    copy_head: bool = setting(False, "add PALM's pointer-generator copy head (2.3)")
    layer_norm_eps: float = setting(1e-12, "LayerNorm epsilon (BERT's 1e-12)")

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl={self.attn_impl!r}; choose one of {ATTN_IMPLS}")

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    to_dict = asdict


PRESETS = {
    # a CPU classroom model that trains on a laptop in minutes (no dropout: minutes underfit)
    "tiny": dict(n_layer=2, n_head=4, n_embd=128, ffn_dim=512, max_position=256, dropout=0.0),
    "small": dict(n_layer=6, n_head=8, n_embd=512, ffn_dim=2048, max_position=512),
    # the papers' BASE (UniLM 2.1, UniLMv2 4.1, ERNIE-GEN 4, PALM 3.1)
    "base": dict(n_layer=12, n_head=12, n_embd=768, ffn_dim=3072, max_position=512),
    # the papers' LARGE (UniLM, UniLMv2, ERNIE-GEN)
    "large": dict(n_layer=24, n_head=16, n_embd=1024, ffn_dim=4096, max_position=512),
}

ATTN_IMPLS = ("naive", "sdpa", "flex")


# --- Attention: one entry point, two paths --------------------------------------------------------
def attention(q, k, v, mask, bias=None, impl="sdpa", dropout_p=0.0):
    """Masked multi-head attention. q: (B, H, Lq, D); k, v: (B, H, Lk, D); mask: (B, Lq, Lk) bool,
    True = "query i may attend key j"; bias: None or (B, H, Lq, Lk), -inf where the mask says no."""
    if impl == "naive":
        return naive_attention(q, k, v, mask, bias, dropout_p)
    if impl == "flex":
        return fast.flex(q, k, v, mask, bias)
    # sdpa takes either the boolean mask (broadcast over heads) or the float bias-with-mask
    m = mask[:, None] if bias is None else bias.to(q.dtype)            # (B, 1 or H, Lq, Lk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=dropout_p)


def naive_attention(q, k, v, mask, bias=None, dropout_p=0.0):
    """softmax(Q K^T / sqrt(d) + bias, masked) V, written out (Vaswani et al. Eq. 1)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))            # (B, H, Lq, Lk)
    if bias is not None:
        scores = scores + bias
    # -inf: a forbidden key's weight, and so its gradient, is exactly 0 (the leakage tests' rule)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    weights = F.dropout(scores.softmax(dim=-1), p=dropout_p)
    return weights @ v                                                  # (B, H, Lq, D)


# --- Relative position bias (UniLMv2 4.1, after T5): one learned scalar per bucket and head -------
def relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
    """T5's bidirectional bucketing of relative_position = key_pos - query_pos: half the buckets
    for each sign; in a half, a bucket each below max_exact, then log-spaced up to max_distance."""
    half = num_buckets // 2
    # keys to the right use the upper half
    bucket = (relative_position > 0).long() * half
    n = relative_position.abs()
    max_exact = half // 2
    # log-spaced buckets between max_exact and max_distance
    log_ratio = torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (half - max_exact)).long()).clamp(max=half - 1)
    return bucket + torch.where(n < max_exact, n, large)


def compute_dtype(device, dtype):
    """The dtype autocast computes in on `device`, or `dtype` where autocast is off."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class RelativePositionBias(nn.Module):
    def __init__(self, num_buckets, max_distance, n_head, max_position):
        super().__init__()
        self.table = nn.Embedding(num_buckets, n_head)
        # the bucket of every possible distance -(P-1) .. P-1, computed once (not checkpointed)
        distances = torch.arange(-(max_position - 1), max_position)
        self.register_buffer("distance_bucket",
                             relative_position_bucket(distances, num_buckets, max_distance),
                             persistent=False)
        self.offset = max_position - 1
        # fast.speed_up sets fast.BucketBias.apply here on a GPU: the same bias, a faster backward
        self.fast_lookup = None

    def forward(self, q_pos, k_pos):
        """q_pos: (B, Lq), k_pos: (B, Lk) position ids -> bias (B, H, Lq, Lk). From position ids,
        not the sequence index: an appended [P] is as close to its neighbours as its token."""
        buckets = self.buckets(q_pos, k_pos)                            # (B, Lq, Lk)
        if self.fast_lookup is not None:
            weight = self.table.weight
            return self.fast_lookup(weight, buckets, compute_dtype(buckets.device, weight.dtype))
        return self.lookup(buckets)

    def buckets(self, q_pos, k_pos):
        """The bucket (B, Lq, Lk) of every (query, key) pair's distance k_pos - q_pos."""
        rel = k_pos[:, None, :] - q_pos[:, :, None]                     # (B, Lq, Lk)
        return self.distance_bucket[rel + self.offset]

    def lookup(self, buckets):
        """self.table(buckets) -> (B, H, Lq, Lk) by index_select: a faster backward
        (docs/model.md, 'The relative position bias')."""
        rows = self.table.weight.index_select(0, buckets.flatten())    # (B * Lq * Lk, H)
        bias = rows.view(*buckets.shape, -1)                            # (B, Lq, Lk, H)
        return bias.permute(0, 3, 1, 2)                                 # (B, H, Lq, Lk)


# --- KV cache for incremental decoding ------------------------------------------------------------
class KVCache:
    """Per-layer keys, values (and positions) of the tokens so far. A forward attends to cache +
    new; the new K/V wait in `pending` until `commit(n)` keeps the first n (not a query token)."""

    def __init__(self, n_layer):
        self.k = [None] * n_layer            # each (B, H, Lc, D)
        self.v = [None] * n_layer
        self.pos = None                      # (B, Lc) position ids of the cached tokens
        self.pending = [None] * n_layer
        self.pending_pos = None

    def __len__(self):
        return 0 if self.pos is None else self.pos.size(1)

    def key_positions(self, position_ids):
        """position_ids (B, L) of the new tokens -> (B, Lc + L) of every key (once per forward)."""
        self.pending_pos = position_ids
        return torch.cat([self.pos, position_ids], dim=1) if len(self) else position_ids

    def layer(self, i, k_new, v_new):
        """Keys/values layer i attends to: cached ones followed by the new ones."""
        self.pending[i] = (k_new, v_new)
        if self.k[i] is None:
            return k_new, v_new
        return torch.cat([self.k[i], k_new], dim=2), torch.cat([self.v[i], v_new], dim=2)

    def commit(self, n):
        """Keep the first n new tokens of the last forward in the cache."""
        for i, (k_new, v_new) in enumerate(self.pending):
            k_new = k_new[:, :, :n]
            v_new = v_new[:, :, :n]
            self.k[i] = k_new if self.k[i] is None else torch.cat([self.k[i], k_new], dim=2)
            self.v[i] = v_new if self.v[i] is None else torch.cat([self.v[i], v_new], dim=2)
        new_pos = self.pending_pos[:, :n]
        self.pos = new_pos if self.pos is None else torch.cat([self.pos, new_pos], dim=1)
        self.pending = [None] * len(self.pending)

    def reorder(self, index):
        """Beam search: keep batch rows `index` (B',) of every cached tensor."""
        self.k = [k.index_select(0, index) for k in self.k]
        self.v = [v.index_select(0, index) for v in self.v]
        self.pos = self.pos.index_select(0, index)


# --- The Transformer ------------------------------------------------------------------------------
class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg            # attn_impl read at call time: tests and benchmarks switch paths
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mask, bias=None, cache=None, layer_idx=0):
        B, L, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        H = self.cfg.n_head
        q, k, v = (t.view(B, L, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
        if cache is not None:
            k, v = cache.layer(layer_idx, k, v)                        # (B, H, Lc + L, D)
        p = self.cfg.dropout if self.training else 0.0
        impl = self.cfg.attn_impl
        # a dense mask (decoding with a cache): the SDPA path
        impl = "sdpa" if impl == "flex" and torch.is_tensor(mask) else impl
        y = attention(q, k, v, mask, bias, impl, p)                    # (B, H, L, D)
        y = y.transpose(1, 2).reshape(B, L, C)
        return F.dropout(self.proj(y), p, self.training)


class Block(nn.Module):
    """Pre-LN Transformer block: x + Attn(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.ffn = nn.Sequential(nn.Linear(cfg.n_embd, cfg.ffn_dim), nn.GELU(),
                                 nn.Linear(cfg.ffn_dim, cfg.n_embd))
        self.dropout = cfg.dropout

    def forward(self, x, mask, bias=None, cache=None, layer_idx=0):
        x = x + self.attn(self.ln1(x), mask, bias, cache, layer_idx)
        return x + F.dropout(self.ffn(self.ln2(x)), self.dropout, self.training)


def additive_scores(hm, ws, w):
    """PALM's Eq. 3 for every (step t, position l): e_t,l = w . tanh(hm_l + ws_t), hm (B, S, d),
    ws (B, T, d) -> (B, T, S), through a (B, T, S, d) tensor kept for backward (fast/ fuses it)."""
    return (torch.tanh(hm[:, None] + ws[:, :, None]) * w).sum(-1)     # (B, T, S, d) -> (B, T, S)


class PointerGenerator(nn.Module):
    """PALM's copy head (section 2.3, after See et al. 2017) on the backbone's final states.

    s: decoder states s_t (B, T, d); h: context states h_l (B, S, d); src_ids (B, S) the context
    tokens; src_mask (B, S) True = may be copied (real, non-special, not [MASK]).
      P^v     = softmax(W^e (W^v s_t + b^v))                   (Eq. 2: model.lm_logits, tied)
      e_t,l   = w^c . tanh(W^m h_l + W^s s_t + b^c)            (Eq. 3)
      alpha_t = softmax_l(e_t) over the copyable positions      (Eq. 4)
      z_t     = sum_l alpha_t,l h_l                            (Eq. 5)
      P^c(y)  = sum_{l: x_l = y} alpha_t,l  (scatter-add)     (Eq. 6: repeated tokens add up)
      P(y)    = lambda P^v(y) + (1 - lambda) P^c(y)            (Eq. 7)
      lambda  = sigmoid(w^z . z_t + w^s . s_t + b^m)           (Eq. 8: the share GENERATED)
    Training calls `attend` and `mix(..., target=y)`. docs/model.md, "PALM's pointer-generator":
    our P^v (the MLM head), why fp32 and log space, what `chunk` saves, what is left out."""

    @staticmethod
    def _fp32(x):
        """At least fp32: bf16/fp16 under autocast go up, fp64 (gradcheck) stays."""
        return x.to(torch.promote_types(x.dtype, torch.float32))

    def __init__(self, d):
        super().__init__()
        self.W_m = nn.Linear(d, d, bias=False)
        self.W_s = nn.Linear(d, d, bias=True)       # its bias is b^c
        self.w_c = nn.Linear(d, 1, bias=False)
        self.gate = nn.Linear(2 * d, 1)             # [w^z; w^s] and b^m
        # fast.speed_up sets fast.compiled_additive_scores() here on a GPU (the same numbers)
        self.fast_scores = None

    def _scores(self, hm, s):
        """e (B, Tc, S) = w^c . tanh(W^m h + W^s s + b^c) for one chunk of decoder steps (Eq. 3)."""
        scores = self.fast_scores or additive_scores
        return scores(hm, self.W_s(s), self.w_c.weight[0])

    def attend(self, s, h, src_mask, chunk=None):
        """-> alpha (B, T, S) fp32 (Eq. 3-4) and the gate's logit (B, T) fp32 (Eq. 5, 8). chunk k:
        the scores k decoder steps at a time, checkpointed when training (None: all at once)."""
        hm = self.W_m(h)                                        # (B, S, d), shared by every step t
        T = s.size(1)
        step = chunk or max(T, 1)
        scores = self._scores
        # keep only the chunk's inputs; redo the tanh in backward
        if chunk and torch.is_grad_enabled():
            scores = lambda *x: torch.utils.checkpoint.checkpoint(self._scores, *x,
                                                                  use_reentrant=False)
        parts = [scores(hm, s[:, i:i + step]) for i in range(0, T, step)]
        e = self._fp32(torch.cat(parts, dim=1))                 # (B, T, S)
        has_src = src_mask.any(-1)[:, None]                     # (B, 1)
        e = e.masked_fill(~src_mask[:, None, :], float("-inf"))
        e = e.masked_fill(~has_src[..., None], 0.0)
        alpha = e.softmax(dim=-1) * has_src[..., None]          # (B, T, S); 0 where nothing to copy
        z = alpha.to(h.dtype) @ h                               # (B, T, d)
        gate_logit = self._fp32(self.gate(torch.cat([z, s], dim=-1)).squeeze(-1))
        # lambda = 1 where nothing to copy
        return alpha, gate_logit.masked_fill(~has_src, float("inf"))

    @staticmethod
    def mix(vocab_logits, alpha, gate_logit, src_ids, target=None):
        """Eq. 6-7 for rows (...): vocab_logits (..., V), alpha and src_ids (..., S), gate_logit
        (...) -> log P over the vocabulary (..., V), or with target (...) log P(target) (...)."""
        log_lam = F.logsigmoid(gate_logit)                      # log lambda
        log_1m_lam = F.logsigmoid(-gate_logit)                  # log(1 - lambda)
        log_pv = PointerGenerator._fp32(vocab_logits).log_softmax(dim=-1)
        if target is None:
            pc = torch.zeros_like(log_pv).scatter_add(-1, src_ids, alpha)   # (..., V), Eq. 6
            log_lam = log_lam[..., None]
            log_1m_lam = log_1m_lam[..., None]
        else:
            log_pv = log_pv.gather(-1, target[..., None]).squeeze(-1)       # (...)
            pc = (alpha * (src_ids == target[..., None])).sum(-1)            # Eq. 6 at y only
        # log P^c = -inf where y cannot be copied. The clamp keeps the branch torch.where discards
        # finite, so its (zero) gradient stays 0 instead of 0 * inf = NaN.
        log_pc = torch.where(pc > 0, pc.clamp_min(torch.finfo(pc.dtype).tiny).log(), float("-inf"))
        # Eq. 7 in log space; log lambda + log P^v is finite: logaddexp's gradient is never 0/0
        return torch.logaddexp(log_lam + log_pv, log_1m_lam + log_pc)

    def forward(self, vocab_logits, s, h, src_ids, src_mask, force_lambda=None):
        """-> log P (B, T, V), lambda (B, T), alpha (B, T, S). force_lambda fixes the gate, for
        looking only: 1.0 gives P^v, 0.0 gives P^c (log -inf, gradient NaN outside the context)."""
        alpha, gate_logit = self.attend(s, h, src_mask)
        if force_lambda is not None:
            fixed_logit = float(torch.logit(torch.tensor(float(force_lambda))))
            gate_logit = torch.full_like(gate_logit, fixed_logit)
        index = src_ids[:, None, :].expand(-1, s.size(1), -1)                         # (B, T, S)
        logp = self.mix(vocab_logits, alpha, gate_logit, index)
        return logp, torch.sigmoid(gate_logit), alpha


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        d = cfg.n_embd
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.pos_emb = nn.Embedding(cfg.max_position, d)
        self.seg_emb = nn.Embedding(cfg.n_segment, d)
        self.emb_ln = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.rel_bias = None
        if cfg.rel_pos_buckets:
            self.rel_bias = RelativePositionBias(cfg.rel_pos_buckets, cfg.rel_pos_max_distance,
                                                 cfg.n_head, cfg.max_position)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        # LM head: BERT's transform (dense, GELU, LN), the tied embedding, a bias (PALM's Eq. 2)
        self.lm_transform = nn.Sequential(nn.Linear(d, d), nn.GELU(),
                                          nn.LayerNorm(d, eps=cfg.layer_norm_eps))
        self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        # pooler + classifier
        self.nsp_head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 2))
        self.copy_head = PointerGenerator(d) if cfg.copy_head else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        # BERT: N(0, 0.02) weights, zero biases, LayerNorm (1, 0)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    # --- the backbone -----------------------------------------------------------------------------
    def embed(self, input_ids, position_ids, segment_ids):
        """Token + absolute position + segment embeddings, LayerNorm, dropout -> (B, L, d)."""
        # a clear error where the check is free (a GPU would wait; there the embedding's stops it)
        if not position_ids.is_cuda and position_ids.max() >= self.config.max_position:
            raise ValueError(f"position id {int(position_ids.max())} >= max_position "
                             f"{self.config.max_position}; truncate the input (train.py does) "
                             "or use a config with more positions")
        x = self.tok_emb(input_ids) + self.pos_emb(position_ids) + self.seg_emb(segment_ids)
        return F.dropout(self.emb_ln(x), self.config.dropout, self.training)

    def encode(self, x, position_ids, attn_mask: Mask, cache=None):
        """Run the blocks over embeddings x (B, L, d). attn_mask: (B, L, Lc + L) bool with Lc
        cached keys, or a MaskSpec built here (dense; for flex, fast/'s block-sparse mask)."""
        if isinstance(attn_mask, MaskSpec):
            if self.config.attn_impl == "flex" and cache is None:
                return fast.encode_flex(self, x, position_ids, attn_mask)
            attn_mask = attn_mask.dense()
        if attn_mask.dim() == 2:
            attn_mask = attn_mask[None].expand(x.size(0), -1, -1)
        # a query that may see nothing (a padding row) would make softmax 0/0: let it see itself,
        # harmlessly (no `if dead.any()`: that would wait for the GPU at every forward)
        n_cached = attn_mask.size(-1) - x.size(1)
        dead = ~attn_mask.any(dim=-1)                                  # (B, L)
        eye = torch.eye(x.size(1), dtype=torch.bool, device=x.device)  # (L, L)
        eye = F.pad(eye, (n_cached, 0))                                # (L, Lc + L)
        attn_mask = attn_mask | (eye[None] & dead[..., None])
        k_pos = position_ids if cache is None else cache.key_positions(position_ids)
        bias = None
        if self.rel_bias is not None:
            # computed once, shared by every layer (UniLMv2 4.1), -inf where the mask forbids
            bias = self.rel_bias(position_ids, k_pos)                  # (B, H, L, Lc + L)
            bias = bias.masked_fill(~attn_mask[:, None], float("-inf"))
            bias = bias.to(compute_dtype(x.device, bias.dtype))        # cast once, not per layer
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, bias, cache, i)
        return self.ln_f(x)

    def forward(self, input_ids, position_ids, segment_ids, attn_mask: Mask, cache=None):
        """-> hidden states (B, L, d). attn_mask: a Mask (True = query i may attend key j)."""
        x = self.embed(input_ids, position_ids, segment_ids)
        return self.encode(x, position_ids, attn_mask, cache)

    # --- heads ------------------------------------------------------------------------------------
    def lm_logits(self, h):
        """(..., d) -> (..., V): the masked-LM / generation head, tied to the token embedding."""
        return self.lm_transform(h) @ self.tok_emb.weight.t() + self.lm_bias

    def nsp_logits(self, h_first):
        """(B, d) states at [SOS] -> (B, 2) is-next / not-next logits (UniLM 2.3, from BERT)."""
        return self.nsp_head(h_first)

    # --- bookkeeping ------------------------------------------------------------------------------
    def num_params(self):
        """Parameters outside the embedding tables (the count FLOPs and papers quote)."""
        n = sum(p.numel() for p in self.parameters())
        return n - sum(e.weight.numel() for e in (self.tok_emb, self.pos_emb, self.seg_emb))

    def describe(self):
        """'2 layers, 128 wide, 0.52M parameters (+0.59M in embeddings)': what train.py prints."""
        n_all = sum(p.numel() for p in self.parameters())
        n_body = self.num_params()
        return (f"{self.config.n_layer} layers, {self.config.n_embd} wide, {n_body / 1e6:.2f}M "
                f"parameters (+{(n_all - n_body) / 1e6:.2f}M in embeddings)")

    def estimate_flops(self, seq_len, pred_frac=1.0):
        """Training FLOPs per token at sequence length seq_len: 6 N + 12 n_layer d seq_len + 6 d V
        pred_frac (Kaplan et al. 2020, the PaLM paper; docs/model.md derives it)."""
        cfg = self.config
        # the LM bias is not a matmul
        n_body = self.num_params() - cfg.vocab_size
        return (6 * n_body + 12 * cfg.n_layer * cfg.n_embd * seq_len
                + 6 * cfg.n_embd * cfg.vocab_size * pred_frac)


# peak dense bf16 tensor FLOP/s by device name, for MFU
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12,
              "4090": 165e12}


def peak_flops(device):
    """Peak bf16 FLOP/s of a CUDA device looked up by name, or None (CPU, unknown card)."""
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)

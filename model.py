"""The one Transformer backbone every objective runs on: a BERT-sized encoder in nanoGPT style
(token + absolute position + segment embeddings, pre-LN blocks and a final LayerNorm, or with
`post_ln` BERT's own post-LN blocks): h = model(ids, positions, segments, attn_mask), (B, L, d);
its heads apart: lm_logits(h), tied to the embedding, nsp_logits(h[:, 0]), UniLM's next sentence,
copy_head, PALM's pointer-generator (Eq. 2-8).

Position ids are explicit ([P] and [ATTN] reuse their token's); the mask is a `Mask`. In reading
order: attention (naive and sdpa), the relative position bias (UniLMv2 4.1), the block, the
backbone with its LM and NSP heads, PALM's copy head, the readable `KVCache`.
The GPU layer fast/ stands above this file: it fills the hooks left here (`ATTENTION`, `DESCRIBED`,
`RelativePositionBias.fast_lookup`, `PointerGenerator.fast_scores`); nothing here imports it.
The device's side of a run stands at the end: the precision it computes in (`choose_dtype`), the
fast layer's pieces it can run (`fast_pieces`), its peak FLOP/s.
docs/model.md tells the longer story. Left out: rotary embeddings, GQA, MoE.
"""
import contextlib
import math
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Union

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    post_ln: bool = setting(False, "BERT's post-LN blocks, LN(x + f(x)), no final LayerNorm (the "
                                   "papers' backbone; convert.py from-hf makes them); else pre-LN")

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


# --- Attention: one entry point, a path by name -------------------------------------------------
def naive_attention(q, k, v, mask, bias=None, dropout_p=0.0):
    """softmax(Q K^T / sqrt(d) + bias, masked) V, written out (Vaswani et al. Eq. 1)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))            # (B, H, Lq, Lk)
    if bias is not None:
        scores = scores + bias
    # -inf: a forbidden key's weight, and so its gradient, is exactly 0 (the leakage tests' rule)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    weights = F.dropout(scores.softmax(dim=-1), p=dropout_p)
    return weights @ v                                                  # (B, H, Lq, D)


def sdpa_attention(q, k, v, mask, bias=None, dropout_p=0.0):
    """The same through torch's fused kernel, which takes either the boolean mask (broadcast over
    heads) or the float bias-with-mask."""
    m = mask[:, None] if bias is None else bias.to(q.dtype)            # (B, 1 or H, Lq, Lk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=dropout_p)


# the attention paths by ModelConfig.attn_impl; the fast layer adds "flex" (fast.flex)
ATTENTION = {"naive": naive_attention, "sdpa": sdpa_attention}
# the paths that read the mask DESCRIBED (a MaskSpec) in their own kernel: attn_impl -> fn(model,
# position_ids, spec) -> (mask, bias) for every block. The fast layer adds "flex"
# (fast.describe_flex)
DESCRIBED = {}


def attention(q, k, v, mask, bias=None, impl="sdpa", dropout_p=0.0):
    """Masked multi-head attention. q: (B, H, Lq, D); k, v: (B, H, Lk, D); mask: (B, Lq, Lk) bool,
    True = "query i may attend key j"; bias: None or (B, H, Lq, Lk), -inf where the mask says no."""
    if impl not in ATTENTION:
        raise ValueError(f"attn_impl={impl!r} is the fast layer's: `import fast` first "
                         "(train.py and generate.py do where it can run)")
    return ATTENTION[impl](q, k, v, mask, bias, dropout_p)


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
        # a hook: the fast layer puts fast.BucketBias.apply here on a GPU (a faster backward)
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


# --- The block ------------------------------------------------------------------------------------
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
        # a dense mask on a DESCRIBED path (decoding with a cache): the SDPA path
        impl = "sdpa" if impl in DESCRIBED and torch.is_tensor(mask) else impl
        y = attention(q, k, v, mask, bias, impl, p)                    # (B, H, L, D)
        y = y.transpose(1, 2).reshape(B, L, C)
        return F.dropout(self.proj(y), p, self.training)


class Block(nn.Module):
    """A Transformer block, one of two layouts (docs/model.md, "Pre-LN and post-LN"):
    pre-LN (the default):    x + Attn(LN(x)), then x + FFN(LN(x));   a final LayerNorm follows
    post-LN (cfg.post_ln):   LN(x + Attn(x)), then LN(x + FFN(x));   BERT's (Devlin et al. 2019),
    which UniLM, ERNIE-GEN and PALM start from. The FFN's GELU is the erf one, BERT's."""

    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.ffn = nn.Sequential(nn.Linear(cfg.n_embd, cfg.ffn_dim), nn.GELU(),
                                 nn.Linear(cfg.ffn_dim, cfg.n_embd))
        self.dropout = cfg.dropout
        self.post_ln = cfg.post_ln

    def forward(self, x, mask, bias=None, cache=None, layer_idx=0):
        if self.post_ln:
            # the cache's keys and values still come from x, the block's input, as in pre-LN
            x = self.ln1(x + self.attn(x, mask, bias, cache, layer_idx))
            return self.ln2(x + F.dropout(self.ffn(x), self.dropout, self.training))
        x = x + self.attn(self.ln1(x), mask, bias, cache, layer_idx)
        return x + F.dropout(self.ffn(self.ln2(x)), self.dropout, self.training)


# --- The backbone and its heads ------------------------------------------------------------------
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
        # pre-LN's residual stream is never normalised inside the blocks: a final LayerNorm does it
        self.ln_f = nn.Identity() if cfg.post_ln else nn.LayerNorm(d, eps=cfg.layer_norm_eps)
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
        # a clear error on a CPU (on a GPU the embedding's own check stops it: docs/model.md)
        if not position_ids.is_cuda and position_ids.max() >= self.config.max_position:
            raise ValueError(f"position id {int(position_ids.max())} >= max_position "
                             f"{self.config.max_position}; truncate the input (train.py does) "
                             "or use a config with more positions")
        x = self.tok_emb(input_ids) + self.pos_emb(position_ids) + self.seg_emb(segment_ids)
        return F.dropout(self.emb_ln(x), self.config.dropout, self.training)

    def encode(self, x, position_ids, attn_mask: Mask, cache=None):
        """Run the blocks over embeddings x (B, L, d). attn_mask: (B, L, Lc + L) bool with Lc
        cached keys, or a MaskSpec: built here densely, or by a DESCRIBED path in its kernel."""
        described = DESCRIBED.get(self.config.attn_impl)
        if isinstance(attn_mask, MaskSpec) and described is not None and cache is None:
            mask, bias = described(self, position_ids, attn_mask)
        else:
            mask, bias = self.dense_mask(attn_mask, position_ids, cache, x.size(0))
        for i, block in enumerate(self.blocks):
            x = block(x, mask, bias, cache, i)
        return self.ln_f(x)

    def dense_mask(self, attn_mask: Mask, position_ids, cache, batch_size):
        """-> the (B, L, Lc + L) bool mask every block uses, and the relative position bias
        (B, H, L, Lc + L), -inf where the mask says no (None without one)."""
        if isinstance(attn_mask, MaskSpec):
            attn_mask = attn_mask.dense()
        if attn_mask.dim() == 2:
            attn_mask = attn_mask[None].expand(batch_size, -1, -1)
        # a query that may see nothing (a padding row) would make softmax 0/0: let it see itself,
        # harmlessly
        L = position_ids.size(1)
        dead = ~attn_mask.any(dim=-1)                                  # (B, L)
        eye = torch.eye(L, dtype=torch.bool, device=attn_mask.device)  # (L, L)
        eye = F.pad(eye, (attn_mask.size(-1) - L, 0))                  # (L, Lc + L)
        attn_mask = attn_mask | (eye[None] & dead[..., None])
        # every key's position (the cache notes the new tokens' here)
        k_pos = position_ids if cache is None else cache.key_positions(position_ids)
        if self.rel_bias is None:
            return attn_mask, None
        # computed once, shared by every layer (UniLMv2 4.1), -inf where the mask forbids
        bias = self.rel_bias(position_ids, k_pos)                      # (B, H, L, Lc + L)
        bias = bias.masked_fill(~attn_mask[:, None], float("-inf"))
        # cast once, not per layer
        return attn_mask, bias.to(compute_dtype(attn_mask.device, bias.dtype))

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


# --- PALM's copy head -----------------------------------------------------------------------------
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
        # a hook: the fast layer puts its fused scores here on a GPU (the same numbers)
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


# --- The device: the precision a run computes in, the fast pieces it runs, its peak FLOP/s -------
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# bf16 runs natively from compute capability 8.0 (A100, RTX 30xx, L4, H100); older cards (T4 7.5,
# V100 7.0, P100 6.0) emulate it or fail: they compute in fp16, whose range needs a loss scaler
NATIVE_BF16 = (8, 0)
# half-precision arithmetic from compute capability 5.3
NATIVE_FP16 = (5, 3)


def choose_dtype(name, device_type, capability=None, cpu_dtypes=("bf16", "fp16")):
    """--dtype auto | bf16 | fp16 | fp32 -> the dtype autocast computes in, by name. auto: bf16 on a
    CUDA card of compute capability (major, minor) >= 8.0, fp16 below (train.py adds a gradient
    scaler), fp32 on a CPU. cpu_dtypes: what this torch's CPU autocast computes in
    (`cpu_autocast_dtypes`). A dtype the device cannot run: a ValueError of one line."""
    if name != "auto" and name not in DTYPES:
        raise ValueError(f"--dtype {name!r}: choose auto, bf16, fp16 or fp32")
    if device_type != "cuda":
        if name in ("auto", "fp32"):
            return "fp32"
        if name not in cpu_dtypes:
            raise ValueError(f"--dtype {name}: torch {torch.__version__}'s CPU autocast does not "
                             "compute in it; use --dtype fp32 (or bf16)")
        return name
    cc = ".".join(map(str, capability))
    if name == "auto":
        return "bf16" if tuple(capability) >= NATIVE_BF16 else "fp16"
    if name == "bf16" and tuple(capability) < NATIVE_BF16:
        raise ValueError(f"--dtype bf16: this card (compute capability {cc}) has no native bf16, "
                         "which needs 8.0 or more; use --dtype fp16 (or auto)")
    if name == "fp16" and tuple(capability) < NATIVE_FP16:
        raise ValueError(f"--dtype fp16: this card (compute capability {cc}) has no native fp16; "
                         "use --dtype fp32")
    return name


def cpu_autocast_dtypes():
    """The half dtypes this torch's CPU autocast computes a matmul in (an older torch turns CPU fp16
    autocast off with a warning)."""
    found = []
    for name in ("bf16", "fp16"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast("cpu", dtype=DTYPES[name]):
                if (torch.ones(1, 1) @ torch.ones(1, 1)).dtype == DTYPES[name]:
                    found.append(name)
    return tuple(found)


def device_dtype(name, device):
    """choose_dtype for this machine's device (a torch.device)."""
    if device.type == "cuda":
        return choose_dtype(name, "cuda", torch.cuda.get_device_capability(device))
    return choose_dtype(name, device.type, cpu_dtypes=cpu_autocast_dtypes())


def autocast(device, dtype_name):
    """The autocast context a run computes in: none for fp32 (weights stay fp32 either way)."""
    if dtype_name == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype_name])


# the least compute capability each piece of the fast layer needs. torch.compile's kernels are
# Triton's, which runs from 7.0; FlexAttention and fast/'s own Triton kernels are written for the
# shared memory and bf16 of 8.0 cards (and checked on 9.0 only): below, the readable SDPA path and
# the compiled copy scores. CUDA graphs run on any card torch supports.
FAST_PIECES = {"compile": (7, 0), "flex": (8, 0), "triton": (8, 0), "cuda_graphs": (0, 0)}


def fast_pieces(capability):
    """{piece: on} for a CUDA card of compute capability (major, minor); None (no card): all off."""
    return {piece: capability is not None and tuple(capability) >= least
            for piece, least in FAST_PIECES.items()}


def describe_fast_pieces(capability):
    """The one line a door prints about them, e.g. 'fast layer on compute capability 7.5: compile,
    cuda_graphs; off: flex (needs 8.0), triton (needs 8.0)'."""
    on = fast_pieces(capability)
    version = lambda cc: ".".join(map(str, cc))
    line = (f"fast layer on compute capability {version(capability)}: "
            f"{', '.join(p for p, v in on.items() if v) or 'nothing'}")
    off = [f"{p} (needs {version(FAST_PIECES[p])})" for p, v in on.items() if not v]
    return line + (f"; off: {', '.join(off)}" if off else "")


# peak dense bf16 tensor FLOP/s by device name, for MFU
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12,
              "4090": 165e12}


def peak_flops(device):
    """Peak bf16 FLOP/s of a CUDA device looked up by name, or None (CPU, unknown card)."""
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)

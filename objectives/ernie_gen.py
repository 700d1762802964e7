"""ERNIE-GEN (Xiao et al., IJCAI 2020, section 3): infilling, noise-aware and span-by-span
generation. docs/objectives.md ("ERNIE-GEN") shows its use and tells the steps, the position
layout, the span vocabulary's t-test, the bad-input rules and what was measured.

One example is ONE sequence [S'; T'; A_W; A_S] with ONE mask (masks.multi_flow): one attention
call per layer runs the three flows of Eq. 5; `separate_flows` computes them apart (Eq. 2-6) and
the tests hold the two equal. Infilling (3.1): fragments of lengths from D, whole words, until
gamma = 25% of the passage, each token at its own position. Noise (3.2): rho of T' made random,
labels the clean T. Span flow (3.3): T' cut by greedy lookup in V_span. Loss: Eq. 7.
Left out: decoding (generate.py's loop is the infilling decoding of 3.4), fp16 and token-count
batching; the lengths D are constants (LENGTH_DISTRIBUTIONS), not options.
"""
import json
import math
import os
from collections import Counter
from itertools import accumulate
from pathlib import Path

import torch
from tqdm import tqdm

from objectives import Example, Objective, option, random_token, warn_once
from objectives.masks import CTX, ORIG, PSEUDO, SPAN
from utils import atomic_write

# D = {U(1,4), U(4,32)} with p 0.4 / 0.6 (3.1)
LENGTH_DISTRIBUTIONS = ((0.4, (1, 4)), (0.6, (4, 32)))
# one-sided t-test at alpha = 0.005
T_CRITICAL = 2.576


# --- words and the span vocabulary ----------------------------------------------------------------
def continuation_ids(tokenizer):
    """Ids of the `##` pieces: they continue the word before them."""
    return frozenset(i for i in range(len(tokenizer)) if tokenizer.id_to_token(i).startswith("##"))


def word_ranges(ids, continuation):
    """[(start, end)] token ranges of the words of ids: a piece and the `##` pieces after it."""
    starts = [k for k, i in enumerate(ids) if k == 0 or i not in continuation]
    return list(zip(starts, starts[1:] + [len(ids)]))


def t_statistic(count, n_total, p_independent):
    """t = (p(w) - p'(w)) / sqrt(sigma^2 / N), p(w) = count / N, sigma^2 = p(w)(1 - p(w)) (3.3)."""
    p = count / n_total
    var = p * (1 - p)
    return math.inf if var == 0 else (p - p_independent) / math.sqrt(var / n_total)


class SpanVocab:
    """V_span: the kept bigrams and trigrams, each a tuple of words (a word = the tuple of its piece
    ids). Every unigram belongs to V_span implicitly, so segmentation always succeeds."""

    def __init__(self, ngrams):
        self.ngrams = frozenset(ngrams)

    def __len__(self):
        return len(self.ngrams)

    def segment(self, words):
        """Greedy from the current word: trigram, bigram, else unigram (3.3) -> words per span."""
        sizes = []
        i = 0
        while i < len(words):
            n = next((n for n in (3, 2)
                      if i + n <= len(words) and tuple(words[i:i + n]) in self.ngrams), 1)
            sizes.append(n)
            i += n
        return sizes


def _sentences(corpus, tokenizer):
    """Items of a corpus as token-id sentences: a text, a sentence of ids, or a passage of them."""
    for item in corpus:
        if isinstance(item, str):
            yield tokenizer.encode(item)
        elif len(item) and hasattr(item[0], "__len__"):  # a passage: a list of sentences
            yield from ([int(i) for i in s] for s in item)
        else:
            yield [int(i) for i in item]


def build_span_vocab(corpus, tokenizer, n_bigrams=200_000, n_trigrams=50_000, min_t=T_CRITICAL,
                     cache_path=None, progress=True):
    """Count word n-grams over the corpus (texts, token-id sentences or passages), keep the top
    t-statistics (3.3) -> SpanVocab; a cache_path of the same tokenizer and settings is loaded."""
    settings = dict(tokenizer=tokenizer.fingerprint(), n_bigrams=n_bigrams, n_trigrams=n_trigrams,
                    min_t=min_t)
    if cache_path and os.path.exists(cache_path):
        if json.loads(Path(cache_path).read_text(encoding="utf-8")).get("settings") == settings:
            return load_span_vocab(cache_path, tokenizer)
    continuation = continuation_ids(tokenizer)
    word_id = {}
    counts = {1: Counter(), 2: Counter(), 3: Counter()}
    sentences = tqdm(_sentences(corpus, tokenizer), desc="span vocabulary", unit=" sentences",
                     disable=not progress)
    for ids in sentences:
        w = [word_id.setdefault(tuple(ids[a:b]), len(word_id))
             for a, b in word_ranges(ids, continuation)]
        for n in (1, 2, 3):                                 # n-grams inside one sentence
            counts[n].update(zip(*(w[k:] for k in range(n))))
    n_words = sum(counts[1].values())
    p1 = {g[0]: c / n_words for g, c in counts[1].items()}  # p(w_i)
    rows = []
    for n, k in ((2, n_bigrams), (3, n_trigrams)):
        total = sum(counts[n].values())
        scored = [(t_statistic(c, total, math.prod(p1[x] for x in g)), c, g)
                  for g, c in counts[n].items()]
        rows += sorted((s for s in scored if s[0] >= min_t), key=lambda s: -s[0])[:k]
    words = list(word_id)                                   # word index -> piece ids
    text = lambda g: " ".join(tokenizer.id_to_token(i) for x in g for i in words[x])
    # JSON with one n-gram a line: [pieces, t, count]
    if cache_path:
        ngram_lines = ",\n".join(json.dumps([text(g), t, c]) for t, c, g in rows)
        atomic_write(cache_path, f'{{"settings": {json.dumps(settings)}, "words": {n_words}, '
                                 f'"ngrams": [\n{ngram_lines}\n]}}\n')
    return SpanVocab(tuple(words[x] for x in g) for _, _, g in rows)


def load_span_vocab(path, tokenizer):
    """Read a build_span_vocab cache file (JSON rows [n-gram pieces, t, count]) -> SpanVocab."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"span vocabulary {path!r} does not exist; "
                                "build it with build_span_vocab")
    table = json.loads(Path(path).read_text(encoding="utf-8"))
    if table.get("settings", {}).get("tokenizer") != tokenizer.fingerprint():
        raise ValueError(f"{path}: span vocabulary was built with another tokenizer; rebuild it")
    continuation = continuation_ids(tokenizer)
    ngrams = []
    for pieces, _, _ in table["ngrams"]:
        ids = [tokenizer.token_to_id(p) for p in pieces.split(" ")]
        ngrams.append(tuple(tuple(ids[a:b]) for a, b in word_ranges(ids, continuation)))
    return SpanVocab(ngrams)


# --- Eq. 2-6 flow by flow: the naive computation --------------------------------------------------
def separate_flows(model, input_ids, position_ids, segment_ids, kind, step):
    """The multi-flow attention of 3.3 the way the paper writes it: each flow its own attention,
    per layer (Eq. 2-4, masks of Eq. 6 written from the equations, not from masks.multi_flow),
    for ONE example (1-D tensors, no padding) with the model's own blocks (pre- or post-LN) -> the
    final states of X = [S'; T'], A_W and A_S (empty without a span flow). Slow, for reading and
    checking: no dropout, no relative bias (ERNIE-GEN uses none)."""
    if model.rel_bias is not None:
        raise ValueError("separate_flows: the model has a relative position bias, "
                         "which ERNIE-GEN does not use")
    is_x = (kind == CTX) | (kind == ORIG)               # X = [S'; T']
    is_w = kind == PSEUDO                               # A_W
    is_s = kind == SPAN                                 # A_S
    x_kind = kind[is_x]
    x_step = step[is_x]
    # S' and T' inside X
    src = x_kind == CTX
    tgt = x_kind == ORIG
    # M_C (Eq. 2): every row of X sees S'; a T' token t_i also sees t_<=i
    m_c = src[None, :] | (tgt[:, None] & tgt[None, :] & (x_step[None, :] <= x_step[:, None]))

    def m_gen(q_step):
        """M_W (Eq. 3, q_step = i) and M_S (Eq. 4, q_step = b, the start of the query's span):
        keys [X; A] -> S', t_<q_step, and the query itself (no other [ATTN])."""
        seen = src[None, :] | (tgt[None, :] & (x_step[None, :] < q_step[:, None]))
        return torch.cat([seen, torch.eye(len(q_step), dtype=torch.bool, device=kind.device)], 1)

    def mh_attn_layer(blk, q_in, kv_in, mask):
        """One layer: queries from q_in, keys/values from kv_in (mask: True = attend)."""
        C = q_in.size(-1)
        H = model.config.n_head
        # pre-LN normalises a block's input; post-LN (BERT's) its sums
        norm = (lambda t: t) if blk.post_ln else blk.ln1
        q = blk.attn.qkv(norm(q_in)).split(C, -1)[0]
        _, k, v = blk.attn.qkv(norm(kv_in)).split(C, -1)
        heads = lambda t: t.view(-1, H, C // H).transpose(0, 1)                 # (H, L, D)
        # QK^T / sqrt(d_k)
        scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(C // H)
        # softmax(QK^T / sqrt(d_k) + M)
        w = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (w @ heads(v)).transpose(0, 1).reshape(-1, C)
        if blk.post_ln:
            x = blk.ln1(q_in + blk.attn.proj(y))
            return blk.ln2(x + blk.ffn(x))
        x = q_in + blk.attn.proj(y)
        return x + blk.ffn(blk.ln2(x))

    e = model.embed(input_ids[None], position_ids[None], segment_ids[None])[0]
    x = e[is_x]
    a_w = e[is_w]
    a_s = e[is_s]
    m_w = m_gen(step[is_w])
    m_s = m_gen(step[is_s])
    for blk in model.blocks:
        # every flow reads the layer-l states of X
        x, a_w, a_s = (mh_attn_layer(blk, x, x, m_c),
                       mh_attn_layer(blk, a_w, torch.cat([x, a_w]), m_w),
                       mh_attn_layer(blk, a_s, torch.cat([x, a_s]), m_s))
    return model.ln_f(x), model.ln_f(a_w), model.ln_f(a_s)


# --- the objective --------------------------------------------------------------------------------
class ErnieGenObjective(Objective):
    name = "ernie_gen"
    # infilling decoding (3.4): [ATTN] at the next position, dropped after each step
    query_token = "[ATTN]"
    min_passage = 2               # a source and a target fragment
    segments = (0, 1)

    gamma = option(0.25, "share of a passage's tokens that go into the target fragments (3.1: 25%)")
    rho_p = option(0.05, "pre-training noise: share of target tokens made random (4.1: 0.05)")
    rho_f = option(0.7, "fine-tuning noise rate (Table 1: 0.7 SQuAD QG/CNN-DM, 0.5 Gigaword base)")
    lam_pretrain = option(0.5, "Eq. 7 weight lambda of the word flow in pre-training "
                               "(span flow: 1 - lambda)")
    lam_finetune = option(1.0, "Eq. 7 lambda in fine-tuning (1.0: word flow only)")
    span_vocab = option(None, "the t-test span vocabulary (a build_span_vocab JSON file); "
                              "train.py builds one")

    def check_options(self):
        self.check_probabilities("gamma", "rho_p", "rho_f", "lam_pretrain", "lam_finetune")
        self.check_room(3, "[SOS] [EOS] [EOS]")
        pretrain = self.task == "pretrain"
        # the noising rate rho (3.2) and Eq. 7's lambda of this task
        self.rho = float(self.rho_p if pretrain else self.rho_f)
        self.lam = float(self.lam_pretrain if pretrain else self.lam_finetune)
        self.spans_table = (load_span_vocab(self.span_vocab, self.tok)
                            if isinstance(self.span_vocab, (str, os.PathLike)) else self.span_vocab)
        self.continuation = continuation_ids(self.tok)
        if self.lam < 1 and self.spans_table is None:
            warn_once("ernie_gen: no span vocabulary given (option span_vocab); "
                      "the span flow treats every word as a span")

    @classmethod
    def prepare(cls, options, tokenizer, examples, cache_dir, task="pretrain", progress=True):
        """Pre-training without a span_vocab: the t-test span vocabulary of the training passages
        (3.3), kept in cache_dir. Fine-tuning needs none (lam_finetune = 1: the word flow only)."""
        if task != "pretrain" or options.get("span_vocab"):
            return options
        path = Path(cache_dir) / "span_vocab.json"
        build_span_vocab(examples, tokenizer, cache_path=path, progress=progress)
        return {**options, "span_vocab": str(path)}

    # -- 3.1 multi-granularity target fragments ----------------------------------------------------
    def sample_fragments(self, words, rng):
        """Fragments as word ranges [(w0, w1)] in the order drawn, and the (lo, hi) of D drawn. A
        length is kept while its start is redrawn (up to 20 misses): crowding does not bias it."""
        probs, bounds = zip(*LENGTH_DISTRIBUTIONS)
        lo_hi = rng.choices(bounds, probs)[0]               # D_i
        budget = max(1, round(self.gamma * words[-1][1]))   # gamma of the passage's tokens
        taken = [False] * len(words)
        fragments = []
        used = 0
        length = None
        misses = 0
        # rejection sampling; gives up on a crowded passage
        for _ in range(50 + 20 * budget):
            if used >= budget:
                break
            if length is None or misses == 20:
                length = min(rng.randint(*lo_hi), budget - used)
                misses = 0
            w0 = w1 = rng.randrange(len(words))
            # whole words up to length tokens
            while w1 < len(words) and words[w1][0] - words[w0][0] < length:
                w1 += 1
            # ran off the passage's end
            short = words[w1 - 1][1] - words[w0][0] < length
            # overlap, touch, all of S
            if short or any(taken[max(w0 - 1, 0):w1 + 1]) or w1 - w0 == len(words):
                misses += 1
                continue
            taken[w0:w1] = [True] * (w1 - w0)
            fragments.append((w0, w1))
            used += words[w1 - 1][1] - words[w0][0]
            length = None
        return fragments, lo_hi

    def spans(self, ids):
        """Span ranges [(b, e)] covering ids (a fragment of T'): V_span lookup of words (3.3)."""
        words = word_ranges(ids, self.continuation)
        if self.spans_table is not None:
            sizes = self.spans_table.segment([tuple(ids[a:b]) for a, b in words])
        else:
            sizes = [1] * len(words)                        # fallback: every word is a span
        # a span of n words ending at word e (exclusive): tokens from words[e - n] to words[e - 1]
        return [(words[e - n][0], words[e - 1][1]) for n, e in zip(sizes, accumulate(sizes))]

    # -- building examples -------------------------------------------------------------------------
    def noise(self, tgt_ids, rng):
        """T' (3.2): each token of T made a uniformly random non-special id with probability rho."""
        return [random_token(self.tok, rng) if rng.random() < self.rho else t for t in tgt_ids]

    def layout(self, src_ids, src_pos, tgt_ids, noised, tgt_pos, spans):
        """One Example [S'; T'; A_W; A_S]: tgt_ids the clean T (the labels), noised its T' (the
        input), spans 0-based target ranges [(b, e)] covering T', cut in T' (3.3)."""
        S = len(src_ids)
        m = len(tgt_ids)
        attn = self.tok.attn_id
        seg_s, seg_t = self.segments
        steps = list(range(1, m + 1))
        ex = Example(input_ids=src_ids + noised + [attn] * m,
                     position_ids=src_pos + tgt_pos + tgt_pos,
                     segment_ids=[seg_s] * S + [seg_t] * 2 * m,
                     labels=[-100] * (S + m) + tgt_ids,       # labels: the clean T
                     kind=[CTX] * S + [ORIG] * m + [PSEUDO] * m,
                     step=[0] * S + steps + steps)
        # span-by-span flow: [ATTN]_j carries its span's start
        if self.lam < 1:
            ex.input_ids += [attn] * m
            ex.position_ids += tgt_pos
            ex.segment_ids += [seg_t] * m
            ex.kind += [SPAN] * m
            ex.step += [b + 1 for b, e in spans for _ in range(b, e)]
            ex.labels += tgt_ids
        return ex

    def pretrain_example(self, passage, rng):
        ids = self.truncate([int(t) for s in passage for t in s], self.max_len - 2, "a passage")
        words = word_ranges(ids, self.continuation)
        fragments = sorted(self.sample_fragments(words, rng)[0]) if len(words) >= 2 else []
        if not fragments:
            self.count_skip("passage too short for a fragment (needs two words)")
            return None
        in_target = [False] * len(ids)
        tgt_ids = []
        tgt_pos = []
        ranges = []
        for w0, w1 in fragments:
            a = words[w0][0]
            b = words[w1 - 1][1]
            in_target[a:b] = [True] * (b - a)
            ranges.append((len(tgt_ids), len(tgt_ids) + b - a))  # the fragment's range in T
            tgt_ids += ids[a:b]
            # each T token keeps its position in [SOS] passage [EOS]
            tgt_pos += range(a + 1, b + 1)
        keep = [k for k in range(len(ids)) if not in_target[k]]
        src_ids = [self.tok.sos_id] + [ids[k] for k in keep] + [self.tok.eos_id]
        src_pos = [0] + [k + 1 for k in keep] + [len(ids) + 1]
        # the noise first (3.2), then the spans cut in the noised T' (3.3), fragment by fragment
        noised = self.noise(tgt_ids, rng)
        spans = []
        if self.lam < 1:
            spans = [(f0 + b, f0 + e) for f0, f1 in ranges for b, e in self.spans(noised[f0:f1])]
        return self.layout(src_ids, src_pos, tgt_ids, noised, tgt_pos, spans)

    def seq2seq_example(self, src, tgt, rng):
        src, tgt = self.fit_pair([int(t) for t in src], [int(t) for t in tgt])
        S = len(src) + 2        # [SOS] src [EOS]
        m = len(tgt) + 1        # tgt [EOS]
        target = tgt + [self.tok.eos_id]
        # the noise first (3.2), then the spans cut in T' (3.3); the [EOS] is a span of its own
        noised = self.noise(target, rng)
        spans = self.spans(noised[:-1]) + [(m - 1, m)] if self.lam < 1 else []
        return self.layout([self.tok.sos_id] + src + [self.tok.eos_id], list(range(S)), target,
                           noised, list(range(S, S + m)), spans)

    # -- Eq. 7 -------------------------------------------------------------------------------------
    def compute_loss(self, model, batch):
        # all flows (Eq. 5)
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        # L_word: at the word-flow [ATTN]s
        loss_w, acc_w = self.lm_loss_at(model, h, batch, PSEUDO)
        metrics = {"loss_word": loss_w.detach(), "acc_word": acc_w}
        loss = loss_w
        if self.lam < 1:
            # L_span: at the span-flow [ATTN]s
            loss_s, acc_s = self.lm_loss_at(model, h, batch, SPAN)
            # Eq. 7: lambda L_word + (1 - lambda) L_span
            loss = self.lam * loss_w + (1 - self.lam) * loss_s
            metrics.update(loss_span=loss_s.detach(), acc_span=acc_s)
        metrics["loss"] = loss.detach()
        return loss, metrics

"""The papers' numbers and terms, each written out in this file with its section, checked against the code.

One place a reader can audit: every number below is copied from a paper (the comment above it says where) and
never read from the code's own constants. A test takes the code's value (an option's default, which is what
train.py uses, a built objective, a model preset, or statistics measured on batches) and compares it with the
paper's. Our own choices (the tiny and small presets, boundary_slack, stage1_frac, ...) have no test here.
"""
import inspect
import math
import random

import pytest
import torch
import torch.nn.functional as F

import model as M
import train
from objectives import get_objective, objective_class
from objectives.ernie_gen import LENGTH_DISTRIBUTIONS, build_span_vocab
from objectives.masks import CTX, ORIG, PAD, PSEUDO, SPAN
from objectives.unilm import LM_TYPES
from tests.helpers import tiny_model
from tokenizer import SPECIAL_TOKENS, WordPiece


@pytest.fixture(scope="module")
def toy_vocab():
    return WordPiece(list(SPECIAL_TOKENS) + ["a", "b", "c", "d"])


def default(objective, key):
    """The default of an objective's option: the value train.py uses unless a flag says otherwise."""
    return objective_class(objective).option_table()[key].default


def originals(batch):
    """The uncorrupted tokens: inputs with the labels put back."""
    return torch.where(batch.labels != -100, batch.labels, batch.input_ids)


def corruption_shares(batch, rows, mask_id):
    """Shares of [MASK] / kept / random among the predicted slots `rows` (B, L) bool of a batch, and their count."""
    inputs, labels = batch.input_ids[rows], batch.labels[rows]
    masked = inputs == mask_id
    kept = ~masked & (inputs == labels)
    return [float(x.float().mean()) for x in (masked, kept, ~masked & ~kept)], len(inputs)


# --- UniLM (Dong et al. 2019) ----------------------------------------------------------------------------------

def test_unilm_cloze_and_finetuning_rates():
    # 2.4: "The token masking probability is 15%."
    assert default("unilm", "mask_prob") == 0.15
    # 2.4: "80% of the time we randomly mask one token each time, and 20% of the time we mask a bigram or a
    # trigram": span probability 0.2, longest span 3 tokens
    assert default("unilm", "span_prob") == 0.2
    assert default("unilm", "max_span") == 3
    # 2.3: "For the bidirectional LM, we also include the next sentence prediction task"
    assert default("unilm", "nsp") is True
    # 2.5 (fine-tuning masks target tokens) with 3.1 and 3.3: "The masking probability is 0.7."
    assert default("unilm", "target_mask_prob") == 0.7


def test_unilm_lm_mix():
    # 2.4: "1/3 of the time we use the bidirectional LM objective, 1/3 of the time we employ the
    # sequence-to-sequence LM objective, and both left-to-right and right-to-left LM objectives are sampled with
    # rate of 1/6"
    paper = {"bidirectional": 1 / 3, "seq2seq": 1 / 3, "left_to_right": 1 / 6, "right_to_left": 1 / 6}
    weights = {lm: default("unilm", f"weight_{lm}") for lm in paper}
    total = sum(weights.values())
    assert {lm: w / total for lm, w in weights.items()} == pytest.approx(paper)


@pytest.mark.parametrize("objective", ["unilm", "palm"])
def test_bert_80_10_10_measured(tok, passages, objective):
    # UniLM 2.4: "Among masked positions, 80% of the time we replace the token with [MASK], 10% of the time with a
    # random token, and keeping the original token for the rest." PALM 2.1 masks "following BERT's practice"
    obj = get_objective(objective, tok)
    if objective == "palm":
        obj.set_step(0, 1)                                  # stage 1: the MLM on the context
        batch = obj.make_batch(passages["train"][:400], random.Random(0))
    else:
        batch = obj.make_batch(passages["train"][:400], random.Random(0), lm_type="bidirectional")
    shares, n = corruption_shares(batch, batch.labels != -100, tok.mask_id)
    assert n > 2000
    assert shares == pytest.approx([0.8, 0.1, 0.1], abs=0.025)


# 2.1: "segment embeddings also play a role of LM identifier in that we use different segment embeddings for
# different LM objectives"; the ids are the official code's: bidirectional 0 / 1 (two segments),
# left-to-right 2, right-to-left 3, sequence-to-sequence 4 (source) / 5 (target)
OFFICIAL_SEGMENT_IDS = {"bidirectional": (0, 1), "left_to_right": (2, 2), "right_to_left": (3, 3),
                        "seq2seq": (4, 5)}


@pytest.mark.parametrize("lm", LM_TYPES)
def test_unilm_segment_ids_identify_the_lm_and_its_mask(tok, passages, lm):
    """Each LM's batches carry its own segment ids AND its own mask (2.3), written out: i = query, j = key."""
    obj = get_objective("unilm", tok, max_len=128)
    batch = obj.make_batch(passages["train"][:6], random.Random(0), lm_type=lm)
    first, second = OFFICIAL_SEGMENT_IDS[lm]
    for b in range(len(batch)):
        n = int((batch.kind[b] != PAD).sum())
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        eos = (batch.input_ids[b, :n] == tok.eos_id).nonzero()[:, 0].tolist()
        n_src = n if lm in ("left_to_right", "right_to_left") else eos[0] + 1
        assert batch.segment_ids[b, :n_src].eq(first).all() and batch.segment_ids[b, n_src:n].eq(second).all()
        # 2.3: bidirectional: "every token is allowed to attend across all positions"; left-to-right: "The
        # representation of each token encodes only the leftward context tokens and itself" (j <= i); right-to-left
        # the future (right) context (j >= i); seq2seq: the source sees the source, a target token the source, the
        # target to its left and itself
        want = {"bidirectional": torch.ones(n, n, dtype=torch.bool), "left_to_right": j <= i,
                "right_to_left": j >= i, "seq2seq": (j < n_src) | (j <= i)}[lm]
        assert torch.equal(batch.attn_mask[b, :n, :n], want)
    if lm == "seq2seq":                                     # fine-tuning (2.5) is the seq2seq LM
        assert get_objective("unilm", tok, task="seq2seq").segments == OFFICIAL_SEGMENT_IDS["seq2seq"]


# --- UniLMv2 (Bao et al. 2020) ---------------------------------------------------------------------------------

def test_pmlm_blockwise_masking_and_corruption_defaults():
    # Algorithm 1: "until sum |M_j| >= 0.15|x|" (4.1: "The token masking probability was 15%")
    assert default("pmlm", "mask_prob") == 0.15
    # Algorithm 1: "l <- rand_int(2, 6) if rand() < 0.4 else 1"; 4.1: "can mask up to 6-gram"
    assert default("pmlm", "block_prob") == 0.4
    assert default("pmlm", "max_block") == 6
    # 4.1: "80% of the time we replaced the token with masks, 10% of the time with a random token, and keeping
    # the original token for the rest"
    assert default("pmlm", "mask_token_prob") == 0.8
    assert default("pmlm", "random_token_prob") == 0.1


def test_pmlm_batches_measured(tok, passages):
    obj = get_objective("pmlm", tok)
    batch = obj.make_batch(passages["train"][:300], random.Random(0))
    ctx, orig = batch.kind == CTX, originals(batch)
    ae = ctx & (batch.labels != -100)
    text = ctx & (orig != tok.sos_id) & (orig != tok.eos_id)
    ratios = (ae.sum(-1) / text.sum(-1)).tolist()
    # Algorithm 1: masking stops once >= 15% of the text is masked (one block past it at most)
    assert min(ratios) >= 0.15 and sum(ratios) / len(ratios) < 0.19
    # Algorithm 1: blocks of 1 to 6 tokens, a 6-gram among them
    sizes = [int((batch.kind[b] == ORIG).logical_and(batch.step[b] == r).sum())
             for b in range(len(batch)) for r in batch.step[b][batch.kind[b] == ORIG].unique().tolist()]
    assert min(sizes) == 1 and max(sizes) == 6
    # 4.1: 80% [MASK], 10% random, 10% kept, at the masked positions
    shares, n = corruption_shares(batch, ae, tok.mask_id)
    assert n > 2000 and shares == pytest.approx([0.8, 0.1, 0.1], abs=0.025)


def test_pmlm_relative_position_bias_settings():
    # 4.1: "We also add relative position bias (Raffel et al., 2019) to attention scores": T5's 32 buckets;
    # Appendix A, Table 7: "Max relative position 128"
    assert objective_class("pmlm").model_defaults == {"rel_pos_buckets": 32, "rel_pos_max_distance": 128}


def t5_bucket(relative_position, num_buckets=32, max_distance=128):
    """T5's bidirectional bucket (Raffel et al. 2019), as their code writes it, for relative_position = key - query:
    half the buckets per sign, exact buckets below half / 2, then log-spaced ones up to max_distance."""
    num_buckets //= 2
    ret = (relative_position > 0).long() * num_buckets
    n = relative_position.abs()
    max_exact = num_buckets // 2
    val_if_large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                                * (num_buckets - max_exact)).long()
    val_if_large = torch.minimum(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(n < max_exact, n, val_if_large)


def test_relative_position_buckets_are_t5s():
    # UniLMv2 4.1: T5's relative position bias, 32 buckets, distances up to 128 (Table 7)
    rel = torch.arange(-300, 301)
    assert torch.equal(M.relative_position_bucket(rel, 32, 128), t5_bucket(rel, 32, 128))
    # by hand: 0..7 exact, then log-spaced (8 -> 8, 16 -> 10, 32 -> 12, 64 -> 14, 128 and beyond -> 15);
    # keys to the right (key - query > 0) use the upper 16
    by_hand = {0: 0, 1: 17, -1: 1, 7: 23, -7: 7, 8: 24, -8: 8, 15: 25, 16: 26, -16: 10, 31: 27, 32: 28, -32: 12,
               63: 29, 64: 30, -64: 14, 127: 31, -127: 15, 128: 31, 1000: 31, -1000: 15}
    got = M.relative_position_bucket(torch.tensor(list(by_hand)), 32, 128).tolist()
    assert dict(zip(by_hand, got)) == by_hand


# --- ERNIE-GEN (Xiao et al. 2020) ------------------------------------------------------------------------------

def test_ernie_gen_fragment_lengths_and_budget(toy_vocab):
    # 3.1: "two uniform distributions D = {U(1,4), U(4,32)} with probability of 0.4 and 0.6 respectively"
    assert {bounds: p for p, bounds in LENGTH_DISTRIBUTIONS} == {(1, 4): 0.4, (4, 32): 0.6}
    # 3.1: "we set a hyperparameter gamma = 0.25, which denotes the ratio of length of all fragments to that of
    # the input sequence S"
    assert default("ernie_gen", "gamma") == 0.25
    # measured: D_i drawn per passage with p 0.4 / 0.6, fragments spend 25% of a 1000-token passage
    obj = get_objective("ernie_gen", toy_vocab)
    rng, words, regimes = random.Random(0), [(k, k + 1) for k in range(1000)], []
    for _ in range(600):
        fragments, regime = obj.sample_fragments(words, rng)
        regimes.append(regime)
        assert sum(w1 - w0 for w0, w1 in fragments) == 250
    assert regimes.count((1, 4)) / 600 == pytest.approx(0.4, abs=0.06)


def test_ernie_gen_noise_lambda_and_span_vocabulary(tok, passages):
    # 4.1: "The noising rate rho_p for pre-training is 0.05."
    assert default("ernie_gen", "rho_p") == 0.05
    # Table 1 (fine-tuning): rho_f = 0.7 for SQuAD QG and CNN/DailyMail, base and large (our default)
    assert default("ernie_gen", "rho_f") == 0.7
    # 3.3 (Eq. 7): "we set lambda = 0.5 and lambda = 1.0 respectively in pre-training and fine-tuning"
    assert default("ernie_gen", "lam_pretrain") == 0.5
    assert default("ernie_gen", "lam_finetune") == 1.0
    # 3.3: "we select the top 200,000 bigrams, top 50,000 trigrams and all unigrams"
    signature = inspect.signature(build_span_vocab).parameters
    assert (signature["n_bigrams"].default, signature["n_trigrams"].default) == (200_000, 50_000)
    # measured: 5% of the pre-training target tokens noised (a random draw equal to the token stays the same)
    batch = get_objective("ernie_gen", tok).make_batch(passages["train"][:400], random.Random(0))
    noised, clean = batch.input_ids[batch.kind == ORIG], batch.labels[batch.kind == PSEUDO]
    assert noised.numel() > 5000
    assert float((noised != clean).float().mean()) == pytest.approx(0.05, abs=0.012)


class SeesKeys(torch.nn.Module):
    """A stand-in backbone for Eq. 7: a row's state is the number of keys it may attend, its logits that number
    times a fixed random vector. A word-flow [ATTN] sees more of T' than a span-flow one, so the two flows' losses
    differ (a real model at BERT's init predicts the same from both, and Eq. 7's lambda would not show)."""

    def __init__(self, vocab_size):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(vocab_size, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, position_ids, segment_ids, attn_mask):
        if not torch.is_tensor(attn_mask):                  # a mask description (objectives hand the model one)
            attn_mask = attn_mask.dense()
        return attn_mask.sum(-1, keepdim=True).float()     # (B, L, 1)

    def lm_logits(self, h):
        return h * self.w / 10                              # (..., V)


def test_ernie_gen_eq7_lambda_weights_the_word_flow(tok, passages):
    """Eq. 7: L = lambda L_word + (1 - lambda) L_span, computed here from the two flows' rows, at lambda = 0.3."""
    data = passages["train"][:8]
    vocab = build_span_vocab(data, tok, min_t=0.0, progress=False)     # every n-gram: long spans
    obj = get_objective("ernie_gen", tok, lam_pretrain=0.3, span_vocab=vocab)
    batch = obj.make_batch(data, random.Random(0))
    model = SeesKeys(len(tok))
    with torch.no_grad():
        loss, metrics = obj.loss(model, batch)
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)
        flow_loss = lambda rows: F.cross_entropy(model.lm_logits(h[rows]), batch.labels[rows])
        # -log P(T | A_W) over the word flow's [ATTN]s, -log P(T | A_S) over the span flow's
        loss_word, loss_span = flow_loss(batch.kind == PSEUDO), flow_loss(batch.kind == SPAN)
    assert abs(float(loss_word - loss_span)) > 0.1         # so that swapping lambda and 1 - lambda shows
    torch.testing.assert_close(loss, 0.3 * loss_word + (1 - 0.3) * loss_span)
    torch.testing.assert_close(metrics["loss_word"], loss_word)
    torch.testing.assert_close(metrics["loss_span"], loss_span)


# --- PALM (Bi et al. 2020) -------------------------------------------------------------------------------------

def test_palm_context_share_and_masking():
    # 2.2: "the consecutive span of length 80% . L from the beginning of the fragment as context input";
    # 3.1: "up to 400 tokens as the source ... up to 100 tokens as the target" (400 of 500)
    assert default("palm", "context_frac") == 0.8
    # 2.1: the context is masked "following BERT's practice": BERT's 15%
    assert default("palm", "mask_prob") == 0.15
    # 2.3: the pointer-generator is part of PALM; its parameters "learned in pre-training are all kept"
    assert default("palm", "copy") is True


def test_palm_batches_measured(tok, passages):
    obj = get_objective("palm", tok)
    obj.set_step(1, 1)                                      # stage 2: context and continuation
    batch = obj.make_batch(passages["train"][:400], random.Random(0))
    S = batch.extras["source_width"]
    n_ctx = (batch.kind[:, :S] == CTX).sum(-1) - 2          # without [SOS] and [EOS]
    n_cont = (batch.labels[:, S:] != -100).sum(-1) - 1      # without the final [EOS]
    share = n_ctx / (n_ctx + n_cont)
    # 2.2: 80% context, 20% continuation (windows of 20 tokens or more; short ones round)
    long = (n_ctx + n_cont) >= 20
    assert float(share[long].mean()) == pytest.approx(0.8, abs=0.03)
    # 2.1 (BERT): 15% of the context tokens masked
    n_masked = (batch.labels[:, :S] != -100).sum()
    assert float(n_masked / n_ctx.sum()) == pytest.approx(0.15, abs=0.02)


def test_palm_pointer_generator_is_eq_2_to_8():
    """model.PointerGenerator against Eq. 2-8 recomputed term by term on small random tensors (float64)."""
    torch.manual_seed(0)
    d, V, B, T, S = 6, 11, 2, 3, 5
    head = M.PointerGenerator(d).double()
    for p in head.parameters():                             # large enough that tanh and every term matter
        torch.nn.init.normal_(p, std=0.7)
    g = torch.Generator().manual_seed(1)
    vocab_logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)   # W^e (W^v s_t + b^v) of Eq. 2
    s = torch.randn(B, T, d, generator=g, dtype=torch.float64)              # decoder states s_t
    h = torch.randn(B, S, d, generator=g, dtype=torch.float64)              # context states h_l
    src_ids = torch.tensor([[3, 5, 3, 7, 9], [1, 2, 4, 4, 8]])              # repeated tokens add up (Eq. 6)
    src_mask = torch.tensor([[True, True, True, True, False], [True, False, True, True, True]])
    logp, lam, alpha = head(vocab_logits, s, h, src_ids, src_mask)
    # the learnable parameters of Eq. 3 (w^c, W^m, W^s, b^c) and Eq. 8 (w^z, w^s, b^m)
    W_m, W_s, b_c, w_c = head.W_m.weight, head.W_s.weight, head.W_s.bias, head.w_c.weight[0]
    w_z, w_s, b_m = head.gate.weight[0, :d], head.gate.weight[0, d:], head.gate.bias[0]
    with torch.no_grad():
        for b in range(B):
            copyable = [l for l in range(S) if src_mask[b, l]]
            for t in range(T):
                # Eq. 2: P^v = softmax(W^e (W^v s_t + b^v))
                p_v = vocab_logits[b, t].softmax(0)
                # Eq. 3: e_tl = w^c . tanh(W^m h_l + W^s s_t + b^c)
                e = torch.stack([w_c @ torch.tanh(W_m @ h[b, l] + W_s @ s[b, t] + b_c) for l in copyable])
                # Eq. 4: alpha_t = softmax(e_t)
                a = e.softmax(0)
                # Eq. 5: z_t = sum_l alpha_tl h_l
                z = sum(a_l * h[b, l] for a_l, l in zip(a, copyable))
                # Eq. 6: P^c(y) = sum over l with x_l = y of alpha_tl
                p_c = torch.zeros(V, dtype=torch.float64)
                for a_l, l in zip(a, copyable):
                    p_c[src_ids[b, l]] += a_l
                # Eq. 8: lambda = sigmoid(w^z . z_t + w^s . s_t + b^m)
                lam_t = torch.sigmoid(w_z @ z + w_s @ s[b, t] + b_m)
                # Eq. 7: P = lambda P^v + (1 - lambda) P^c
                p = lam_t * p_v + (1 - lam_t) * p_c
                torch.testing.assert_close(alpha[b, t, copyable], a)
                torch.testing.assert_close(lam[b, t], lam_t)
                torch.testing.assert_close(logp[b, t].exp(), p)


def test_output_layer_is_tied_to_the_token_embedding():
    # UniLM 2.4: "The weight matrix of the softmax classifier is tied with token embeddings" (UniLMv2 4.1 too);
    # PALM Eq. 2: W^e "is tied with the corresponding part of the input embedding"
    model = tiny_model(40)
    h = torch.randn(3, model.config.n_embd)
    with torch.no_grad():
        want = model.lm_transform(h) @ model.tok_emb.weight.t() + model.lm_bias
        torch.testing.assert_close(model.lm_logits(h), want)
        model.tok_emb.weight.mul_(2.0)                      # one matrix: the output layer follows the embedding
        torch.testing.assert_close(model.lm_logits(h), model.lm_transform(h) @ model.tok_emb.weight.t()
                                   + model.lm_bias)


# --- the backbone and training defaults --------------------------------------------------------------------------

def test_base_preset_is_the_papers_base():
    # UniLMv2 4.1 and Table 7, PALM 3.1, ERNIE-GEN 4.1 (BERT_BASE): 12 layers, hidden size 768, 12 attention heads,
    # feed-forward inner size 3072; UniLM 2.4, UniLMv2 4.1, ERNIE-GEN 4.1: maximum input length 512
    base = M.PRESETS["base"]
    assert (base["n_layer"], base["n_embd"], base["n_head"], base["ffn_dim"]) == (12, 768, 12, 3072)
    assert base["max_position"] == 512
    # UniLM 2.4, UniLMv2 Table 7, PALM 3.1: dropout 0.1; UniLM 2.4 and PALM 3.1: the GELU activation
    assert M.ModelConfig().dropout == 0.1
    block = tiny_model(40).blocks[0]
    assert any(isinstance(m, torch.nn.GELU) for m in block.ffn.modules())


def test_finetuning_label_smoothing():
    # UniLM 3.1 and 3.3, ERNIE-GEN Table 1: label smoothing 0.1 when fine-tuning (pre-training: none, ours)
    for task, want in (("seq2seq", 0.1), ("pretrain", 0.0)):
        cfg = train.TrainConfig(task=task, seq_len=8)
        train.resolve_defaults(cfg, {"max_position": 512})
        assert cfg.label_smoothing == want

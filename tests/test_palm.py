"""PALM: the pointer-generator mixture (Eq. 2-8), the 80/20 examples, the two stages, leakage by autograd."""
import random

import pytest
import torch

import model as M
import objectives
from objectives import get_objective, leakage, masks
from tests.helpers import input_gradients, tiny_model


def head_inputs(B=2, T=3, S=5, d=8, V=12, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)
    src_ids = torch.randint(0, V, (B, S), generator=g)
    src_mask = torch.rand(B, S, generator=g) < 0.7
    src_mask[:, 0] = True
    return r(B, T, V), r(B, T, d), r(B, S, d), src_ids, src_mask


def pointer(d=8, seed=0):
    torch.manual_seed(seed)
    head = M.PointerGenerator(d)
    for p in head.parameters():            # larger than BERT's init, so alpha and lambda are far from uniform
        torch.nn.init.normal_(p, std=0.5)
    return head


# --- the mixture ---------------------------------------------------------------------------------------------------

def test_mixture_is_a_distribution_and_lambda_one_is_the_vocab_softmax():
    logits, s, h, src_ids, src_mask = head_inputs()
    src_mask[1] = False                                     # example 1: nothing to copy (an empty source)
    head = pointer()
    logp, lam, alpha = head(logits, s, h, src_ids, src_mask)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 3))
    assert torch.all((lam[0] > 0) & (lam[0] < 1)) and torch.all(lam[1] == 1)
    torch.testing.assert_close(logp[1], logits[1].log_softmax(-1))       # no copy support: P = P^v
    torch.testing.assert_close(alpha[0].sum(-1), torch.ones(3))
    assert torch.all(alpha[0][:, ~src_mask[0]] == 0) and torch.all(alpha[1] == 0)
    logp1, _, _ = head(logits, s, h, src_ids, src_mask, force_lambda=1.0)
    torch.testing.assert_close(logp1, logits.log_softmax(-1))


def test_copy_mass_lands_on_the_context_ids_repeated_tokens_add_up():
    logits, s, h, _, _ = head_inputs(B=1, T=2, S=4, V=12)
    src_ids = torch.tensor([[5, 7, 5, 9]])
    src_mask = torch.tensor([[True, True, True, False]])   # 9 is, say, a [MASK]: never a copy target
    logp, _, alpha = pointer()(logits, s, h, src_ids, src_mask, force_lambda=0.0)
    p, a = logp.exp()[0], alpha[0]
    torch.testing.assert_close(p[:, 5], a[:, 0] + a[:, 2])
    torch.testing.assert_close(p[:, 7], a[:, 1])
    others = [v for v in range(12) if v not in (5, 7)]
    assert torch.all(p[:, others] == 0) and torch.all(a[:, 3] == 0)
    # lambda mixes the two: P = lambda P^v + (1 - lambda) P^c
    logp_mix, lam, _ = pointer()(logits, s, h, src_ids, src_mask)
    pv = logits[0].softmax(-1)
    want = lam[0, :, None] * pv + (1 - lam[0, :, None]) * p
    torch.testing.assert_close(logp_mix.exp()[0], want)


def test_gradcheck_float64():
    logits, s, h, src_ids, src_mask = head_inputs(B=2, T=3, S=4, d=4, V=6, dtype=torch.float64)
    src_ids[0] = torch.tensor([1, 3, 1, 2])                 # a repeated token
    head = pointer(d=4).double()
    target = torch.tensor([[1, 5, 3], [0, 2, 4]])
    for x in (logits, s, h):
        x.requires_grad_(True)
    full = lambda lg, s_, h_: head(lg, s_, h_, src_ids, src_mask)[0]
    assert torch.autograd.gradcheck(full, (logits, s, h), fast_mode=True)

    def at_target(lg, s_, h_):
        alpha, gate = head.attend(s_, h_, src_mask, chunk=2)          # several checkpointed chunks
        return head.mix(lg, alpha, gate, src_ids[:, None].expand(-1, 3, -1), target=target)
    assert torch.autograd.gradcheck(at_target, (logits, s, h), fast_mode=True)
    torch.testing.assert_close(at_target(logits, s, h), full(logits, s, h).gather(-1, target[..., None])[..., 0])


def test_no_nan_gradients_when_the_target_cannot_be_copied():
    logits, s, h, src_ids, src_mask = head_inputs()
    src_mask[1] = False                                     # and one example with nothing to copy at all
    target = torch.full((2, 3), 11)
    src_ids[src_ids == 11] = 10                             # 11 is nowhere in the context
    head = pointer()
    for x in (logits, s, h):
        x.requires_grad_(True)
    alpha, gate = head.attend(s, h, src_mask)
    logp = head.mix(logits, alpha, gate, src_ids[:, None].expand(-1, 3, -1), target=target)
    (-logp.sum()).backward()
    grads = [logits.grad, s.grad, h.grad] + [p.grad for p in head.parameters()]
    assert all(torch.isfinite(g).all() for g in grads)
    assert logits.grad.abs().sum() > 0 and head.gate.weight.grad.abs().sum() > 0


def test_chunked_scores_equal_one_chunk():
    logits, s, h, src_ids, src_mask = head_inputs(T=7)
    head = pointer()
    s.requires_grad_(True)
    outs = []
    for chunk in (None, 3):
        s.grad = None
        alpha, gate = head.attend(s, h, src_mask, chunk)
        logp = head.mix(logits, alpha, gate, src_ids[:, None].expand(-1, 7, -1))
        logp.sum().backward()
        outs.append((logp.detach(), s.grad.clone()))
    torch.testing.assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])


# --- examples ------------------------------------------------------------------------------------------------------

def test_split_at_a_near_sentence_boundary():
    from objectives.palm import split_passage
    passage = [[1] * 10, [2] * 7, [3] * 3]                  # 20 tokens, 80% = 16, boundaries at 10 and 17
    assert [len(x) for x in split_passage(passage)] == [17, 3]                       # 17 is within 2 tokens
    assert [len(x) for x in split_passage(passage, boundary_slack=0.0)] == [16, 4]    # no slack: token cut
    assert [len(x) for x in split_passage([[1] * 10, [2] * 10])] == [16, 4]          # boundary 10 is too far
    assert split_passage([[1, 2, 3, 4, 5]]) == ([1, 2, 3, 4], [5])                   # one sentence
    assert split_passage([[7, 8]]) == ([7], [8])                                     # both parts non-empty
    assert split_passage([[7]]) == ([], [7]) and split_passage([]) == ([], [])                # skipped later


def test_80_20_statistics_on_the_corpus(passages):
    from objectives.palm import split_passage
    fracs, at_boundary, n_long = [], 0, 0
    for p in passages["train"][:500]:
        ctx, cont = split_passage(p)
        n = len(ctx) + len(cont)
        if n < 20:
            continue
        n_long += 1
        fracs.append(len(ctx) / n)
        at_boundary += len(ctx) in set(torch.tensor([len(s) for s in p]).cumsum(0).tolist())
        assert abs(len(ctx) - 0.8 * n) <= 0.1 * n + 0.5
    mean = sum(fracs) / len(fracs)
    assert 0.77 < mean < 0.83, mean
    assert at_boundary / n_long > 0.3                       # many cuts land between sentences


def window_of(ex):
    """(context, continuation) ids of a stage-2 pretrain Example, the context unmasked from its labels."""
    S = ex.kind.count(masks.CTX)
    ctx = [y if y != -100 else x for x, y in zip(ex.input_ids[1:S - 1], ex.labels[1:S - 1])]
    return ctx, ex.input_ids[S + 1:]


def test_sliding_window_with_the_stride_of_one_sentence(tok):
    """3.1: pairs come "by a sliding window with the stride of one sentence": every sentence start of a passage is
    a window start (drawn with the rng), the window runs to the passage's end and is cut 80/20 (2.2)."""
    from objectives.palm import split_passage
    obj = get_objective("palm", tok)
    obj.set_step(1, 1)                                      # stage 2: the continuation is in the example
    passage = [[30 + k] * n for k, n in enumerate((12, 9, 15, 7, 10))]   # 5 sentences, 53 tokens
    flat = [t for s in passage for t in s]
    suffixes = {sum(map(len, passage[k:])) for k in range(5)}            # window lengths: 53, 41, 32, 17, 10
    rng, draws = random.Random(0), []
    for _ in range(200):
        ctx, cont = window_of(obj.pretrain_example(passage, rng))
        draws.append((ctx, cont))
        n = len(ctx) + len(cont)
        assert ctx and cont and ctx + cont == flat[-n:]       # a window of whole sentences up to the passage's end
        assert n in suffixes
        # the continuation: whole sentences at the end, or the 20% tail of its window (a cut inside a sentence)
        assert len(cont) in suffixes or len(cont) == n - round(0.8 * n)
    seen = [(tuple(ctx), tuple(cont)) for ctx, cont in draws]
    assert len({cont for _, cont in seen}) > 1
    # every sentence start is drawn, uniformly (200 draws of 5 starts: 40 each on average)
    want = {tuple(map(tuple, split_passage(passage[k:]))) for k in range(5)}
    assert set(seen) == want and min(seen.count(w) for w in want) > 20
    # 53 tokens: cut at the boundary 43 (|43 - 42.4| <= 5.3), the last sentence is the continuation
    assert split_passage(passage)[1] == passage[-1]
    # 17 tokens (7 + 10): cut inside the last sentence at round(13.6) = 14, its 20% tail of 3 tokens
    assert split_passage(passage[3:])[1] == passage[-1][-3:]
    # deterministic by the rng: the same seed draws the same windows
    replay = random.Random(0)
    assert [window_of(obj.pretrain_example(passage, replay)) for _ in range(10)] == draws[:10]


def test_window_edge_cases(tok):
    from objectives.palm import sentence_windows
    # windows of two tokens or more, one per sentence start; a window stops at the budget (13 = max_len 16 - 3)
    assert sentence_windows([[1, 2], [3], [4]], 13) == [[[1, 2], [3], [4]], [[3], [4]]]     # [4] alone: too short
    assert sentence_windows([[1, 2], [3], [4]], 3) == [[[1, 2], [3]], [[3], [4]]]
    assert sentence_windows([[40] * 30, [41] * 5], 13) == [[[40] * 13], [[41] * 5]]        # a long sentence: cut
    assert sentence_windows([[5], [41] * 30], 13) == [[[41] * 13]]       # [5] then 30 tokens: [5] alone, too short
    assert sentence_windows([[], [7]], 13) == [] and sentence_windows([], 13) == []
    obj = get_objective("palm", tok)
    obj.set_step(1, 1)
    rng = random.Random(0)
    # a one-sentence passage: one window, cut inside the sentence; two one-token sentences: one window
    for _ in range(20):
        assert window_of(obj.pretrain_example([[5, 6, 7, 8, 9]], rng)) == ([5, 6, 7, 8], [9])
        assert window_of(obj.pretrain_example([[30], [31]], rng)) == ([30], [31])


def test_windows_on_the_corpus_keep_80_20(tok, passages):
    """Windows drawn from real passages: ~80/20 still, and most multi-sentence passages give several windows."""
    obj = get_objective("palm", tok)
    obj.set_step(1, 1)
    rng, fracs, shorter, n_multi = random.Random(0), [], 0, 0
    for p in passages["train"][:500]:
        ctx, cont = window_of(obj.pretrain_example(p, rng))
        n, n_passage = len(ctx) + len(cont), sum(map(len, p))
        shorter += n < n_passage
        n_multi += len(p) > 1
        if n >= 20:
            fracs.append(len(ctx) / n)
            assert abs(len(ctx) - 0.8 * n) <= 0.1 * n + 0.5
    mean = sum(fracs) / len(fracs)
    assert 0.77 < mean < 0.83, mean
    assert shorter > 0.4 * n_multi                          # a start after sentence 0 (k - 1 of k starts)


def test_seq2seq_layout_written_out(tok):
    obj = get_objective("palm", tok, task="seq2seq")
    SOS, EOS, PAD = tok.sos_id, tok.eos_id, tok.pad_id
    b = obj.make_batch([([11, 12, 13], [21, 22]), ([14], [23, 24, 25])], random.Random(0))
    # S_max = 5 (the longer [SOS] src [EOS]), T_max = 4; example 1's source is padded before its target starts
    assert b.input_ids.tolist() == [[SOS, 11, 12, 13, EOS, SOS, 21, 22, PAD],
                                    [SOS, 14, EOS, PAD, PAD, SOS, 23, 24, 25]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0], [0, 1, 2, 0, 0, 3, 4, 5, 6]]
    assert b.segment_ids.tolist() == [[0] * 5 + [1] * 4] * 2
    assert b.labels.tolist() == [[-100] * 5 + [21, 22, EOS, -100], [-100] * 5 + [23, 24, 25, EOS]]
    want0 = torch.zeros(9, 9, dtype=torch.bool)
    want0[:8, :8] = masks.seq2seq([5], [8], 8)[0]
    assert torch.equal(b.attn_mask[0], want0)
    real1 = torch.tensor([1, 1, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    m1 = b.attn_mask[1]
    assert torch.equal(m1[real1][:, real1], masks.seq2seq([3], [7], 7)[0])
    assert not m1[~real1].any() and not m1[:, ~real1].any()
    assert obj.copy_mask(b).tolist() == [[False, True, True, True, False], [False, True, False, False, False]]


def test_training_layout_is_the_decoding_loop(tok):
    """Each example's rows equal generate.py's loop: source encoded once, then y_t-1 alone at position S + t."""
    model = tiny_model(len(tok), copy_head=True)
    obj = get_objective("palm", tok, task="seq2seq")
    examples = [([40, 41, 42, 43], [50, 51, 52]), ([44, 45], [53, 54, 55, 56])]
    batch = obj.make_batch(examples, random.Random(0))
    S_max = batch.extras["source_width"]
    with torch.no_grad():
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)
        logp_train, _, _ = obj.pointer_outputs(model, batch)
        for b, (src, tgt) in enumerate(examples):
            ids = torch.tensor([[tok.sos_id] + src + [tok.eos_id]])
            S = ids.size(1)
            cache = M.KVCache(model.config.n_layer)
            h_src = model(ids, torch.arange(S)[None], torch.zeros_like(ids), masks.bidirectional([S], S), cache)
            cache.commit(S)
            source = dict(hidden=h_src, ids=ids, mask=torch.ones_like(ids, dtype=torch.bool))
            for t, prev in enumerate([tok.sos_id] + tgt):
                h_t = model(torch.tensor([[prev]]), torch.tensor([[S + t]]), torch.ones(1, 1, dtype=torch.long),
                            torch.ones(1, 1, S + t + 1, dtype=torch.bool), cache)
                cache.commit(1)
                torch.testing.assert_close(h_t[0, 0], h[b, S_max + t], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(obj.decode_logprobs(model, h_t[:, 0], source)[0], logp_train[b, t],
                                           rtol=1e-4, atol=1e-4)


def test_bad_inputs_are_skipped_and_counted(tok, monkeypatch):
    obj = get_objective("palm", tok, max_len=16)
    obj.set_step(10, 10)
    good = [[30, 31, 32], [33, 34]]
    with pytest.warns(UserWarning, match="passage is longer"):
        b = obj.make_batch([[[30]], good, [], [[40] * 30, [41] * 5]], random.Random(0))
    assert obj.skipped == {"passage too short for a context and a continuation": 2}
    assert b.input_ids.size(0) == 2 and int(b.position_ids.max()) < 16     # the long one: truncated, not skipped
    assert int((b.labels[1] != -100).sum()) > 0
    # every example skipped: an empty batch, whose loss is a zero that reaches every parameter (the one policy)
    empty = obj.make_batch([[[30]]], random.Random(0))
    assert len(empty) == 0
    model = tiny_model(len(tok), copy_head=True)
    loss, _ = obj.loss(model, empty)
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is not None for p in model.parameters())
    s2s = get_objective("palm", tok, task="seq2seq", max_len=16)
    monkeypatch.setattr(objectives, "_warned", set())                  # warn_once warns again in this test
    with pytest.warns(UserWarning, match="truncated") as said:
        b = s2s.make_batch([([30, 31], []), ([30] * 40, [31] * 5), ([], [32] * 40)], random.Random(0))
        # sources cut beside targets of other lengths: still one warning, naming max_len
        s2s.make_batch([([30] * 40, [31] * 6), ([30] * 40, [31] * 7)], random.Random(0))
    assert [str(w.message) for w in said].count(
        "palm: a source + target is longer than 16 tokens; truncated") == 1
    assert s2s.skipped == {"empty target": 1}
    assert b.input_ids.size(0) == 2 and int(b.position_ids.max()) < 16
    # the source gives way first (40 -> 16 - 3 - 5 = 8 tokens); a target that cannot fit alone is cut to 13 + [EOS]
    assert b.extras["source_width"] == 10
    assert (b.labels[0] != -100).sum() == 6 and (b.labels[1] != -100).sum() == 14
    with pytest.raises(ValueError, match="unknown option"):
        get_objective("palm", tok, stage_frac=0.1)
    with pytest.raises(ValueError, match="copy_head=True"):
        s2s.loss(tiny_model(len(tok)), b)
    loss, metrics = s2s.loss(tiny_model(len(tok), copy_head=True), b)     # example 2 has an empty source
    assert torch.isfinite(loss) and metrics["lambda_mean"] < 1


def test_determinism_and_masking_rate(tok, passages):
    obj = get_objective("palm", tok)
    obj.set_step(5, 10)
    ex = passages["train"][:16]
    b1, b2 = obj.make_batch(ex, random.Random(3)), obj.make_batch(ex, random.Random(3))
    for k in ("input_ids", "position_ids", "segment_ids", "attn_mask", "labels"):
        assert torch.equal(getattr(b1, k), getattr(b2, k))
    S = b1.extras["source_width"]
    n_ctx = int(b1.attn_mask[:, :S].any(-1).sum()) - 2 * 16
    n_masked = int((b1.labels[:, :S] != -100).sum())
    assert abs(n_masked / n_ctx - 0.15) < 0.02
    # the copy support excludes [MASK] and the other special tokens
    copy_ids = b1.input_ids[:, :S][obj.copy_mask(b1)]
    assert not torch.isin(copy_ids, torch.tensor(sorted(tok.special_ids))).any()
    assert (b1.input_ids[:, :S] == tok.mask_id).sum() > 0


def test_without_the_copy_head_rows_are_not_aligned_and_the_loss_is_the_same(tok, passages):
    """copy=False (Table 6's ablation): nothing reads the context at columns :S, so collate pads no
    context to one width; the same examples' loss (both stages' parts, float64) equals the aligned
    layout's, and the narrower batch is proven leak-free."""
    model = tiny_model(len(tok), attn_impl="naive").double()
    aligned_obj = get_objective("palm", tok, mlm_weight=0.5)             # the copy head's layout
    obj = get_objective("palm", tok, mlm_weight=0.5, copy=False)
    for o in (aligned_obj, obj):
        o.set_step(9, 10)                                                 # stage 2: MLM and continuation
    ex = passages["train"][:16]
    aligned = aligned_obj.make_batch(ex, random.Random(0))
    batch = obj.make_batch(ex, random.Random(0))
    assert "source_width" in aligned.extras and "source_width" not in batch.extras
    real = batch.kind != masks.PAD
    # every row's real tokens come first: no gap between context and continuation
    assert torch.equal(real, torch.arange(real.size(1)) < real.sum(1, keepdim=True))
    assert batch.input_ids.size(1) == int(real.sum(1).max()) <= aligned.input_ids.size(1)
    # a long source with a short target beside a short source with a long target: 15 wide, not 23
    pairs = [([40] * 10, [50] * 2), ([41] * 2, [51] * 10)]
    tuned = get_objective("palm", tok, task="seq2seq", copy=False).make_batch(pairs, random.Random(0))
    assert tuned.input_ids.size(1) == 15
    assert get_objective("palm", tok, task="seq2seq").make_batch(pairs, random.Random(0)).input_ids.size(1) == 23
    loss, m = obj.loss(model, batch)
    loss_aligned, m_aligned = obj.loss(model, aligned)
    torch.testing.assert_close(loss, loss_aligned, rtol=1e-12, atol=1e-12)
    for key in ("loss_mlm", "loss_ar", "acc_mlm", "acc_ar"):
        torch.testing.assert_close(m[key], m_aligned[key], rtol=1e-12, atol=1e-12)
    assert leakage.check(model, batch).leaks == []


# --- leakage by autograd -------------------------------------------------------------------------------------------

def copy_head_gradients(model, obj, batch, b, t, probe):
    """|d probe(row t of example b's continuation) / d input embedding j| through the backbone AND the copy head.

    probe: "logp" (the mixture log P), "alpha" (the copy attention alone) or "lambda" (the gate alone).
    """
    x = model.embed(batch.input_ids, batch.position_ids, batch.segment_ids).detach().requires_grad_(True)
    h = model.encode(x, batch.position_ids, batch.attn_mask)
    S = batch.extras["source_width"]
    s = h[:, S:]
    logp, lam, alpha = model.copy_head(model.lm_logits(s), s, h[:, :S], batch.input_ids[:, :S],
                                       obj.copy_mask(batch))
    y = dict(logp=logp, alpha=alpha, **{"lambda": lam[..., None]})[probe][b, t]
    g = torch.Generator().manual_seed(t)
    (grad,) = torch.autograd.grad((y * torch.randn(y.shape, generator=g)).sum(), x)
    return grad[b].abs().sum(-1), alpha


def test_no_leakage(tok, passages):
    model = tiny_model(len(tok), copy_head=True, attn_impl="naive")
    obj = get_objective("palm", tok)
    obj.set_step(1, 1)
    batch = obj.make_batch(passages["train"][:3], random.Random(0))
    S = batch.extras["source_width"]
    L = batch.input_ids.size(1)
    real = batch.attn_mask.any(-1)
    for b in range(3):
        # MLM rows: nothing from the continuation
        for row in (batch.labels[b, :S] != -100).nonzero()[:, 0].tolist():
            g = input_gradients(model, batch, b, row)
            assert torch.all(g[S:] == 0) and g[:S].sum() > 0
        # continuation row t (at index S + t) predicts y_t+1: it may see the context and rows <= t only
        T = int(real[b, S:].sum())
        for t in range(T):
            for probe in ("logp", "alpha", "lambda"):
                g, alpha = copy_head_gradients(model, obj, batch, b, t, probe)
                assert torch.all(g[S + t + 1:] == 0), (b, t)
                assert torch.all(g[:S][~real[b, :S]] == 0)
                assert g[S + t] > 0 and g[:S].sum() > 0
        # the copy attention covers the context positions only, and only its copyable ones
        assert alpha.shape[-1] == S < L
        assert torch.all(alpha[b][:, ~obj.copy_mask(batch)[b]] == 0)
        torch.testing.assert_close(alpha[b, :T].sum(-1), torch.ones(T))


# --- the two stages ------------------------------------------------------------------------------------------------

def test_stage_switch_and_losses_fall(tok, passages):
    """Stage 1 (MLM) then stage 2 (continuation + copy) on 8 fixed passages (fresh masks each step): both fall."""
    torch.manual_seed(0)
    model = tiny_model(len(tok), n_embd=64, n_head=4, ffn_dim=128, copy_head=True)
    obj = get_objective("palm", tok, stage1_frac=0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng, total, log = random.Random(0), 50, []
    for step in range(total):
        obj.set_step(step, total)
        batch = obj.make_batch(passages["train"][:8], rng)
        loss, metrics = obj.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.append({k: float(v) for k, v in metrics.items()})
        S = batch.extras["source_width"]
        assert (batch.input_ids.size(1) == S) == (step < 25)       # stage 1: no continuation in the batch
    assert [m["stage"] for m in log] == [1] * 25 + [2] * 25          # 0.5 x 50 = 25 steps of stage 1
    assert "loss_ar" not in log[0] and 0 < log[-1]["lambda_mean"] < 1
    assert log[-1]["loss"] == log[-1]["loss_ar"]                      # mlm_weight 0: MLM is reported, not trained
    mean = lambda key, part: sum(m[key] for m in part) / len(part)
    assert mean("loss_mlm", log[15:25]) < mean("loss_mlm", log[:10]) - 1.0
    assert mean("loss_ar", log[-10:]) < mean("loss_ar", log[25:35]) - 1.0


def test_mlm_weight_and_copy_off(tok, passages):
    model = tiny_model(len(tok), copy_head=True)
    ex = passages["train"][:4]
    obj = get_objective("palm", tok, mlm_weight=0.5, label_smoothing=0.1)
    obj.set_step(9, 10)
    loss, m = obj.loss(model, obj.make_batch(ex, random.Random(0)))
    torch.testing.assert_close(loss.detach(), m["loss_ar"] + 0.5 * m["loss_mlm"])
    chunked = get_objective("palm", tok, mlm_weight=0.5, label_smoothing=0.1, copy_chunk=4)
    chunked.set_step(9, 10)
    torch.testing.assert_close(chunked.loss(model, chunked.make_batch(ex, random.Random(0)))[0], loss)
    off = get_objective("palm", tok, copy=False)
    off.set_step(9, 10)
    batch = off.make_batch(ex, random.Random(0))
    loss, m = off.loss(model, batch)
    assert "lambda_mean" not in m and torch.isfinite(loss)
    h = torch.randn(2, model.config.n_embd)
    torch.testing.assert_close(off.decode_logprobs(model, h, None), model.lm_logits(h).log_softmax(-1))
    with pytest.warns(UserWarning, match="set_step"):
        get_objective("palm", tok).make_batch(ex, random.Random(0))

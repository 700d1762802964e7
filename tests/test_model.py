"""The backbone: attention paths agree, relative buckets, the KV cache, config errors."""
import pytest
import torch

import model as M
from objectives import masks
from tests.helpers import tiny_model


def random_mask(B, L, lengths, gen):
    m = torch.rand(B, L, L, generator=gen) < 0.5
    m |= torch.eye(L, dtype=torch.bool)
    valid = masks.bidirectional(lengths, L)
    return m & valid


@pytest.mark.parametrize("buckets", [0, 32])
def test_naive_equals_sdpa_with_padding(buckets):
    gen = torch.Generator().manual_seed(0)
    # float64: the two paths sum in different orders, and in float32 a gradient near zero differs by
    # about 1e-5 (seen on one CPU), which says nothing about the paths
    model = tiny_model(50, rel_pos_buckets=buckets).double()
    B, L = 3, 11
    ids = torch.randint(0, 50, (B, L), generator=gen)
    pos = torch.randperm(L, generator=gen).expand(B, L)            # positions need not be sorted (pseudo tokens)
    seg = torch.randint(0, 2, (B, L), generator=gen)
    mask = random_mask(B, L, [11, 7, 1], gen)
    outs, grads = {}, {}
    for impl in ("naive", "sdpa"):
        model.config.attn_impl = impl
        model.zero_grad()
        h = model(ids, pos, seg, mask)
        h[mask.any(-1)].pow(2).sum().backward()
        outs[impl] = h
        grads[impl] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    real = mask.any(-1)
    assert torch.isfinite(outs["naive"]).all() and torch.isfinite(outs["sdpa"]).all()
    torch.testing.assert_close(outs["naive"][real], outs["sdpa"][real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads["naive"], grads["sdpa"], rtol=1e-4, atol=1e-5)


def test_relative_buckets_by_hand():
    # 32 buckets, max distance 128: 16 per direction, exact below 8, then log-spaced: 8 + floor(8 * log(n/8) / log 16)
    # e.g. distance 15: 8 * log(15/8) / log(16) = 1.81 -> 8 + 1 = 9; distance 127: 7.98 -> 15; 128 and beyond: 15.
    # Keys to the right (positive distance) use buckets 16..31.
    rel = torch.tensor([0, -1, -7, -8, -15, -16, -32, -64, -127, -128, -1000, 1, 7, 8, 16, 127, 128, 5000])
    want = [0, 1, 7, 8, 9, 10, 12, 14, 15, 15, 15, 17, 23, 24, 26, 31, 31, 31]
    assert M.relative_position_bucket(rel, 32, 128).tolist() == want


def test_relative_bias_uses_position_ids_not_indices():
    model = tiny_model(20, rel_pos_buckets=8, rel_pos_max_distance=16)
    pos = torch.tensor([[0, 1, 2, 1]])                              # the last token reuses position 1
    bias = model.rel_bias(pos, pos)                                 # (1, H, 4, 4)
    torch.testing.assert_close(bias[0, :, 3], bias[0, :, 1])        # same position, same bias row


@pytest.mark.parametrize("buckets", [0, 32])
def test_kv_cache_equals_full_recompute(buckets):
    """Encode the source once, then add target tokens one step at a time: equal to one full forward."""
    torch.manual_seed(0)
    model = tiny_model(40, rel_pos_buckets=buckets)
    S, T = 5, 4
    L = S + T
    ids = torch.randint(0, 40, (2, L))
    pos = torch.arange(L).expand(2, L)
    seg = torch.cat([torch.zeros(2, S), torch.ones(2, T)], 1).long()
    full_mask = masks.seq2seq([S, S], [L, L], L)
    full = model(ids, pos, seg, full_mask)

    cache = M.KVCache(model.config.n_layer)
    h_src = model(ids[:, :S], pos[:, :S], seg[:, :S], full_mask[:, :S, :S], cache=cache)
    cache.commit(S)
    torch.testing.assert_close(h_src, full[:, :S], rtol=1e-5, atol=1e-5)
    for t in range(S, L):
        # feed the committed token and a throw-away query at the next position together, keep only the first
        q_id = torch.full((2, 1), 3)
        new_ids = torch.cat([ids[:, t:t + 1], q_id], 1)
        new_pos = torch.tensor([[t, t + 1]]).expand(2, 2)
        mask = torch.ones(2, 2, t + 2, dtype=torch.bool)
        mask[:, 0, t + 1] = False                                    # the real token does not see the query
        h = model(new_ids, new_pos, seg[:, t:t + 1].expand(2, 2), mask, cache=cache)
        cache.commit(1)
        torch.testing.assert_close(h[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    assert len(cache) == L


def test_kv_cache_reorder():
    model = tiny_model(30)
    cache = M.KVCache(model.config.n_layer)
    ids = torch.randint(0, 30, (3, 4))
    pos = torch.arange(4).expand(3, 4)
    model(ids, pos, torch.zeros_like(ids), torch.ones(3, 4, 4, dtype=torch.bool), cache=cache)
    cache.commit(4)
    k0 = cache.k[0].clone()
    cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.k[0], k0[[2, 2, 0]])


def test_padding_rows_are_finite_and_do_not_matter():
    model = tiny_model(30)
    ids = torch.randint(0, 30, (1, 6))
    pos = torch.arange(6)[None]
    seg = torch.zeros_like(ids)
    h_pad = model(ids, pos, seg, masks.bidirectional([4], 6))
    h = model(ids[:, :4], pos[:, :4], seg[:, :4], masks.bidirectional([4], 4))
    assert torch.isfinite(h_pad).all()
    torch.testing.assert_close(h_pad[:, :4], h, rtol=1e-5, atol=1e-5)


def test_config_errors_and_presets():
    with pytest.raises(ValueError, match="unknown ModelConfig keys"):
        M.ModelConfig.from_dict({"n_layers": 3})
    with pytest.raises(ValueError, match="not divisible"):
        M.ModelConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="attn_impl"):
        M.ModelConfig(attn_impl="magic")
    base = M.Transformer(M.ModelConfig(vocab_size=30522, **M.PRESETS["base"]))
    # BERT-base has 110M parameters with a 30522 vocabulary; ours adds only the LM transform and NSP head as BERT does
    assert 105e6 < sum(p.numel() for p in base.parameters()) < 115e6


def test_position_overflow_is_a_clear_error():
    model = tiny_model(30, max_position=8)
    ids = torch.zeros(1, 9, dtype=torch.long)
    with pytest.raises(ValueError, match="max_position"):
        model(ids, torch.arange(9)[None], ids, masks.bidirectional([9], 9))


def test_estimate_flops_formula():
    model = tiny_model(100)
    cfg = model.config
    n = model.num_params() - cfg.vocab_size
    assert model.estimate_flops(64) == 6 * n + 12 * cfg.n_layer * cfg.n_embd * 64 + 6 * cfg.n_embd * cfg.vocab_size
    assert model.estimate_flops(64, pred_frac=0.15) < model.estimate_flops(64)

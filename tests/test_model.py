"""The backbone in both block layouts (pre-LN, BERT's post-LN): attention paths agree, relative buckets, the KV
cache, config errors, the choice of dtype and of the fast layer's pieces for a given card."""
import re

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


LAYOUTS = pytest.mark.parametrize("post_ln", [False, True], ids=["pre-LN", "post-LN"])


@LAYOUTS
@pytest.mark.parametrize("buckets", [0, 32])
def test_naive_equals_sdpa_with_padding(buckets, post_ln):
    gen = torch.Generator().manual_seed(0)
    # float64: the two paths sum in different orders, and in float32 a gradient near zero differs by
    # about 1e-5 (seen on one CPU), which says nothing about the paths
    model = tiny_model(50, rel_pos_buckets=buckets, post_ln=post_ln).double()
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


@LAYOUTS
@pytest.mark.parametrize("buckets", [0, 32])
def test_kv_cache_equals_full_recompute(buckets, post_ln):
    """Encode the source once, then add target tokens one step at a time: equal to one full forward (post-LN too:
    a block's cached keys and values come from its input, in either layout)."""
    torch.manual_seed(0)
    model = tiny_model(40, rel_pos_buckets=buckets, post_ln=post_ln)
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


@LAYOUTS
def test_padding_rows_are_finite_and_do_not_matter(post_ln):
    model = tiny_model(30, post_ln=post_ln)
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


def test_post_ln_block_is_berts_layer_written_out():
    """Post-LN: LN(x + Attn(x)), then LN(x + FFN(x)) with the erf GELU, no final LayerNorm; pre-LN keeps its own."""
    torch.manual_seed(0)
    model = tiny_model(30, n_layer=1, post_ln=True)
    blk = model.blocks[0]
    x = torch.randn(2, 5, 32)
    mask = masks.bidirectional([5, 3], 5)
    q, k, v = blk.attn.qkv(x).view(2, 5, 3, 2, 16).permute(2, 0, 3, 1, 4)          # each (B, H, L, D)
    w = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~mask[:, None], float("-inf")).softmax(-1)
    a = blk.attn.proj((w @ v).transpose(1, 2).reshape(2, 5, 32))
    h = blk.ln1(x + a)
    gelu = lambda t: 0.5 * t * (1 + torch.erf(t / 2 ** 0.5))
    want = blk.ln2(h + blk.ffn[2](gelu(blk.ffn[0](h))))
    real = mask.any(-1)                                     # padding queries (they see nothing) aside
    torch.testing.assert_close(blk(x, mask)[real], want[real], rtol=1e-5, atol=1e-5)
    assert isinstance(model.ln_f, torch.nn.Identity) and not any("ln_f" in n for n in model.state_dict())
    assert "ln_f.weight" in tiny_model(30).state_dict()


@pytest.mark.parametrize("name,device,cc,want", [
    ("auto", "cpu", None, "fp32"), ("auto", "cuda", (9, 0), "bf16"), ("auto", "cuda", (8, 0), "bf16"),
    ("auto", "cuda", (7, 5), "fp16"), ("auto", "cuda", (7, 0), "fp16"), ("fp32", "cuda", (7, 5), "fp32"),
    ("fp16", "cuda", (9, 0), "fp16"), ("bf16", "cpu", None, "bf16"), ("fp16", "cpu", None, "fp16")])
def test_the_dtype_a_device_computes_in(name, device, cc, want):
    assert M.choose_dtype(name, device, cc) == want


@pytest.mark.parametrize("name,device,cc,cpu,words", [
    ("bf16", "cuda", (7, 5), (), "compute capability 7.5) has no native bf16"),
    ("fp16", "cuda", (5, 0), (), "compute capability 5.0) has no native fp16"),
    ("fp16", "cpu", None, ("bf16",), "CPU autocast does not compute in it"),
    ("fp8", "cuda", (9, 0), (), "choose auto, bf16, fp16 or fp32")])
def test_a_dtype_the_device_cannot_run_is_one_line(name, device, cc, cpu, words):
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        M.choose_dtype(name, device, cc, cpu_dtypes=cpu)
    assert "\n" not in str(e.value)


def test_this_torchs_cpu_autocast_and_the_autocast_context():
    found = M.cpu_autocast_dtypes()
    assert "bf16" in found                                   # every torch this project supports
    assert M.device_dtype("auto", torch.device("cpu")) == "fp32"
    lin = torch.nn.Linear(4, 4)
    for name in found:
        with M.autocast(torch.device("cpu"), name):
            assert lin(torch.ones(1, 4)).dtype == M.DTYPES[name]
    with M.autocast(torch.device("cpu"), "fp32"):
        assert lin(torch.ones(1, 4)).dtype == torch.float32


@pytest.mark.parametrize("cc,on", [
    (None, set()), ((6, 0), {"cuda_graphs"}), ((7, 5), {"compile", "cuda_graphs"}),
    ((8, 0), {"compile", "flex", "triton", "cuda_graphs"}), ((9, 0), {"compile", "flex", "triton", "cuda_graphs"})])
def test_the_fast_pieces_a_card_runs(cc, on):
    pieces = M.fast_pieces(cc)
    assert set(pieces) == set(M.FAST_PIECES) and {p for p, v in pieces.items() if v} == on
    if cc is not None:
        line = M.describe_fast_pieces(cc)
        assert line.startswith(f"fast layer on compute capability {cc[0]}.{cc[1]}: ")
        assert all(f"{p} (needs" in line for p in set(M.FAST_PIECES) - on)

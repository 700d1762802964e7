"""On a GPU, the fused paths must still equal the readable ones (CPU tests only see SDPA's math backend).

    python bench/check_cuda.py

For every objective's real pre-training batch (base preset shapes, random weights): the final hidden states of the
naive attention path vs SDPA (which picks cuDNN / efficient kernels on CUDA), in fp32 and under bf16 autocast, as
relative errors ||a - b|| / ||b||; and greedy decoding with the KV cache vs without it (tokens identical).
Prints a table; exits non-zero if a check fails.
"""
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M                                              # noqa: E402
from bench.bench_train import passages, synthetic_tokenizer   # noqa: E402
from generate import generate                                  # noqa: E402
from objectives import get_objective                           # noqa: E402


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def main():
    assert torch.cuda.is_available(), "this check needs a GPU"
    dev = torch.device("cuda")
    tok = synthetic_tokenizer(30522)
    rows, ok = [], True
    for name in ("unilm", "pmlm", "ernie_gen", "palm"):
        obj = get_objective(name, tok, max_len=512)
        cfg = M.ModelConfig(**{**M.PRESETS["base"], "vocab_size": 30522, "dropout": 0.0, **obj.model_defaults})
        torch.manual_seed(0)
        model = M.Transformer(cfg).to(dev).eval()
        batch = obj.make_batch(passages(8, 509, 30522, random.Random(0)), random.Random(0)).to(dev)
        real = batch.attn_mask.any(-1)
        for dtype in (torch.float32, torch.bfloat16):
            out = {}
            for impl in ("naive", "sdpa"):
                model.config.attn_impl = impl
                with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                    out[impl] = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)[real]
            err = rel(out["sdpa"], out["naive"])
            limit = 1e-3 if dtype == torch.float32 else 2e-2      # tf32 / bf16 arithmetic (device METHOD.md)
            ok &= err < limit
            rows.append((name, f"naive vs sdpa, {str(dtype)[6:]}", f"{err:.2e}", "ok" if err < limit else "FAIL"))
        model.config.attn_impl = "sdpa"
        obj_s2s = get_objective(name, tok, task="seq2seq", max_len=512)
        sources = [s[0] for s in passages(4, 100, 30522, random.Random(1))]
        with torch.no_grad():
            a = generate(model, obj_s2s, sources, beam_size=3, max_len=16, use_cache=True)
            b = generate(model, obj_s2s, sources, beam_size=3, max_len=16, use_cache=False)
        same = [x[0][0] for x in a] == [x[0][0] for x in b]
        ok &= same
        rows.append((name, "beam 3: cache vs no cache (fp32)", "tokens equal" if same else "tokens differ",
                     "ok" if same else "FAIL"))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| objective | check | result | |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

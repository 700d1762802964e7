#!/usr/bin/env bash
# Issue 21 items 1 and 3 on one GPU, every baseline in the same run:
#   bash bench/pack_triton_gpu.sh check    # bench/check_cuda.py (packing and Triton included), then the Triton timing
#   bash bench/pack_triton_gpu.sh speed    # Triton checks + timing, then bench_train.py: one passage a row vs packed, HF
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case "${1:-check}" in
  check)
    python bench/check_cuda.py 2>&1 | tee "$OUT/check_cuda.txt" | tail -70
    python bench/profile_step.py --part triton 2>&1 | tee "$OUT/triton.txt" | tail -40 ;;
  speed)
    python bench/profile_step.py --part triton 2>&1 | tee "$OUT/triton.txt" | tail -12
    python bench/check_cuda.py triton 2>&1 | tee "$OUT/check_triton.txt" | grep -c "| ok |"
    grep "FAIL" "$OUT/check_triton.txt"
    python bench/bench_train.py --part bare --pack both --impls sdpa --only "unilm,pmlm,palm (copy)" 2>&1 \
      | tee "$OUT/bench_pack.txt" | tail -25 ;;
esac

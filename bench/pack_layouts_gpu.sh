#!/usr/bin/env bash
# Issue 21 item 1 on one GPU: train.py's packings against one passage a row, every baseline in the same run.
#   bash bench/pack_layouts_gpu.sh bare    # bare steps (padding.py --speed base): every batch on every layout,
#                                          # the embedded corpus, then $DATA (the shared corpus)
#   bash bench/pack_layouts_gpu.sh loop    # train.py's own loop on each layout (bench_train.py --pack layouts)
# Base preset, batch 32, text 512, vocab 30522, bf16, the blocks compiled for any shape (train.py on CUDA).
# Layouts: one passage a row; steady x64 (fast.SteadyPacking, train.py --pack true); each batch at its width x64
# priced for SDPA (fast.plan_packing with fast.key_cost); each batch at its width x64 with the fewest slots; each
# batch at its cheapest width x64 whose rows are at most 5% padding (plan_packing's max_padding; the loop: no
# fewest-slots run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CACHE=${CACHE:-.cache}
DATA=${DATA:-out/data/corpus}
OBJECTIVES=${OBJECTIVES:-unilm,pmlm,ernie_gen,palm}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
case "${1:-bare}" in
  bare)
    for corpus in "" "$DATA"; do
      python bench/padding.py --speed base --vocab 30522 --batches ${BATCHES:-48} --speed_warmup 8 \
        --only "$OBJECTIVES" --cache "$CACHE" ${corpus:+--data "$corpus"} 2>&1 \
        | tee -a "$OUT/bare.txt" | grep -v "^\(Compil\|W1\)"
    done ;;
  loop)
    python bench/bench_train.py --part loop --pack layouts --loop_steps ${STEPS:-150} --cache "$CACHE" \
      --only "${LOOP_ONLY:-unilm,pmlm,ernie_gen,palm (copy)}" 2>&1 | tee "$OUT/loop.txt" | tail -30 ;;
esac

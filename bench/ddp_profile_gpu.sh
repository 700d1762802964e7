#!/usr/bin/env bash
# Issue 21 item 5 (DDP unilm >= 3.8x on 4 GPUs): where a DDP step of train.py goes, then the speed-up itself, one call.
#   bash bench/ddp_profile_gpu.sh                       # unilm: bench/profile_train.py under torchrun on 4 GPUs
#                                                       # (steps 20-25, rank 0's table and every rank's file), then
#                                                       # bench/ddp_scaling.sh on 1 and 4 GPUs
#   OBJECTIVE=pmlm GPUS=2 bash bench/ddp_profile_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
N=${GPUS:-4}
OBJECTIVE=${OBJECTIVE:-unilm}
# the vocabulary and the token cache, built once
python -c "import data; data.prepare_pretrain(None, 30522, '.cache', max_tokens=509, progress=False)"
timeout ${PROFILE_S:-200} torchrun --nproc_per_node "$N" bench/profile_train.py --objective "$OBJECTIVE" --preset base \
  --vocab_size 30522 --seq_len 512 --batch_size 32 --max_steps 30 --log_interval 10 --eval_interval 100000 \
  --ckpt_interval 100000 --progress false --overwrite true --out_dir /tmp/ddp-profile 2>&1 \
  | grep -v USDT | tee "$OUT/ddp_profile.txt" | tail -45
# its runs (and their checkpoints) stay outside $OUT; the table comes back
OUT=/tmp/ddp_scaling OBJECTIVES="$OBJECTIVE" STEPS=${STEPS:-40} GPUS="1 $N" timeout ${SCALING_S:-240} \
  bash bench/ddp_scaling.sh 2>&1 | tee "$OUT/ddp_scaling.txt"

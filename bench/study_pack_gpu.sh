#!/usr/bin/env bash
# Issue 22's budget: the study's jobs with packed batches (study.py --pack auto) against one passage a row, on
# one GPU, four processes under CUDA's multi-process service as study.py --per_gpu 4 --mps runs them, in one run:
#   bash bench/study_pack_gpu.sh      # needs out/data and out/studycache, as bench/study_speed_gpu.sh
# 1. pmlm's pre-training (the study's longest): mps_four, mps_four_pack, mps_eight_pack
# 2. palm's SQuAD QG fine-tuning from random weights (a control cell; 69% padding one pair a row, 6% packed):
#    mps_four, mps_four_pack
# steps/s per process from the progress bars after step FROM (compilation and warm-up left out); logs under
# $OUT/pre and $OUT/ft.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
OUT=$OUT/pre OBJ=pmlm STEPS=${PRE_STEPS:-250} FROM=80 LIMIT=${LIMIT:-130} \
  VARIANTS="mps_four mps_four_pack mps_eight_pack" bash bench/study_speed_gpu.sh
OUT=$OUT/ft OBJ=palm TASK=squad_qg STEPS=${FT_STEPS:-250} FROM=80 LIMIT=${LIMIT:-130} \
  VARIANTS="mps_four mps_four_pack" bash bench/study_speed_gpu.sh

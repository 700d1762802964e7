#!/usr/bin/env bash
# Issue 22: the SQuAD QG fine-tunings from random weights that stop on a NaN loss at lr 1e-3, run again with the
# model's attention done several ways (bench/study_nan.py: by default SDPA with the boolean mask as model.py has it,
# SDPA with an additive finite mask, the written-out softmax; or SDPA held to one backend), $PARALLEL at once on one
# GPU under one MPS daemon.
#   bash bench/study_nan_gpu.sh
#   WAYS="sdpa naive" CELLS="unilm/no pre-training:1;ernie_gen/no pre-training:0" bash bench/study_nan_gpu.sh
#   TRAIN_ONLY=1 WAYS="sdpa_efficient sdpa_cudnn sdpa_math" CELLS="..." bash bench/study_nan_gpu.sh   # which kernel
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WAYS=${WAYS:-"sdpa additive naive"}
CELLS=${CELLS:-"unilm/no pre-training:0;unilm/no pre-training:1;unilm/no pre-training:2;ernie_gen/no pre-training:0;ernie_gen/no pre-training:1;ernie_gen/no pre-training:2"}
PARALLEL=${PARALLEL:-6}
# TRAIN_ONLY=1: the fine-tunings only (whether they stop), no decoding
EXTRA=${TRAIN_ONLY:+--train_only}
WORK=${WORK:-/tmp/nan}
nvidia-smi --query-gpu=name --format=csv,noheader
python bench/study_nan.py backend
mkdir -p "$WORK/cache" "$WORK/logs" && cp -r out/studycache/. "$WORK/cache/"
export OMP_NUM_THREADS=$(( $(nproc) / PARALLEL > 0 ? $(nproc) / PARALLEL : 1 ))
export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps/pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
trap 'echo quit | nvidia-cuda-mps-control' EXIT
for way in $WAYS; do
  python bench/study_nan.py prepare --out "$WORK/$way" --data_dir out/data --cache_dir "$WORK/cache" || exit 1
done
# one line a run: WAY|SYSTEM|SEED; the cells of one seed first, so every way has run on them before the next
IFS=';' read -ra cells <<< "$CELLS"
for cell in "${cells[@]}"; do for way in $WAYS; do echo "$way|${cell%:*}|${cell##*:}"; done; done |
  xargs -P "$PARALLEL" -I{} bash -c 'IFS="|" read -r way name seed <<< "{}"
    log="'"$WORK"'/logs/$way-$(echo "$name" | tr -c "a-z0-9_\n" -)-$seed.log"
    python bench/study_nan.py "$way" "$name" "$seed" --out "'"$WORK"'/$way" --data_dir out/data \
      --cache_dir "'"$WORK"'/cache" '"$EXTRA"' > "$log.json" 2> "$log"'
grep -h '^{"way"' "$WORK"/logs/*.json > "$OUT/nan.jsonl"
tar czf "$OUT/nan-logs.tgz" -C "$WORK" logs
python - "$WORK" <<'PY'
import json, sys
from pathlib import Path
from bench.study_nan import nan_step
work = Path(sys.argv[1])
print("| way | system | seed | stopped on NaN at step | SQuAD QG BLEU-4 | fine-tuning s |\n|---|---|---|---|---|---|")
for f in sorted((work / "logs").glob("*.log.json")):
    results = [line for line in f.read_text().splitlines() if line.startswith('{"way"')]
    log = Path(str(f)[:-len(".json")]).read_text(errors="replace")
    if not results:
        print(f"| {f.name} | crashed: {log.strip().splitlines()[-1] if log.strip() else '?'} | | | | |")
        continue
    r = json.loads(results[-1])
    step = nan_step(log) if r["diverged"] else "-"
    bleu = f"{r['bleu']:.2f}" if r["bleu"] is not None else "-"
    print(f"| {r['way']} | {r['system']} | {r['seed']} | {step} | {bleu} | {r['seconds']:.0f} |")
PY

#!/usr/bin/env bash
# A host sync out of train.py's step, on one GPU: train.py's own loop on an older tree and on this one, objective by
# objective in turn (same machine, same run), after check_cuda.py loop on both (no step between two logs waits for the GPU).
#   mkdir -p .before && git archive OLD_COMMIT -- '*.py' objectives fast bench | tar -x -C .before
#   bash bench/loop_sync_gpu.sh .before
set -uo pipefail
OLD=${1:?usage: bash bench/loop_sync_gpu.sh OLD_TREE}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CACHE=${CACHE:-$PWD/.cache}
STEPS=${STEPS:-100}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
# the calls that wait for the GPU in each tree's steps (this tree's check, run on the old tree's train.py)
cp bench/check_cuda.py "$OLD/bench/check_cuda_now.py"
(cd "$OLD" && python bench/check_cuda_now.py loop) 2>&1 | tee "$OUT/check_loop_before.txt" | tail -6
python bench/check_cuda.py loop 2>&1 | tee "$OUT/check_loop.txt" | tail -6
rm -f "$OUT/before.log" "$OUT/after.log"
for obj in ${OBJECTIVES:-unilm pmlm ernie_gen palm}; do
  label=$obj; [ "$obj" = palm ] && label="palm (copy)"
  (cd "$OLD" && python bench/bench_train.py --part loop --loop_steps "$STEPS" --only "$label" --cache "$CACHE") \
    > "$OUT/before-one.log" 2>&1; cat "$OUT/before-one.log" >> "$OUT/before.log"
  python bench/bench_train.py --part loop --loop_steps "$STEPS" --only "$label" --cache "$CACHE" > "$OUT/after-one.log" 2>&1; cat "$OUT/after-one.log" >> "$OUT/after.log"
  echo "== $obj: before, then after"; grep -h "^| $obj" "$OUT/before-one.log" "$OUT/after-one.log"
done

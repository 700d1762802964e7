#!/usr/bin/env bash
# A refactor's cost on one GPU: bench_train.py's bare steps on an older tree and on this one, in ONE run on ONE
# machine (same card, same torch), then the GPU equality checks of this tree's fast layer.
#
#   mkdir -p .before && git archive OLD_COMMIT -- '*.py' objectives bench | tar -x -C .before   # the old tree
#   bash bench/before_after.sh .before                                                         # on the GPU machine
#
# Both trees read the embedded corpus with the same vocabulary (the cache is trained once and shared); the
# tables print last, and land in $OUT (before.md, after.md, check_cuda.txt) when $OUT is set.
set -euo pipefail
OLD=${1:?usage: bash bench/before_after.sh OLD_TREE}
OUT=${OUT:-$(mktemp -d)}
ARGS=${ARGS:---part bare --impls sdpa --steps 8 --warmup 3}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
(cd "$OLD" && python bench/bench_train.py $ARGS --no_hf --cache /tmp/unigen-cache) 2>&1 | tee "$OUT/before.log"
python bench/bench_train.py $ARGS --cache /tmp/unigen-cache 2>&1 | tee "$OUT/after.log"
python bench/check_cuda.py 2>&1 | tee "$OUT/check_cuda.txt"
echo "== before ($OLD)"; sed -n '/^| run/,$p' "$OUT/before.log"
echo "== after (this tree)"; sed -n '/^| run/,$p' "$OUT/after.log"

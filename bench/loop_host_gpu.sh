#!/usr/bin/env bash
# Issue 21 items 4 and 5 on one GPU: where the host's time goes in train.py's step (bench/loop_host.py), for unilm
# alone and under DDP with one process (DDP's own cost, no peer; static_graph too), and for PALM with and without
# its copy head, each against its bare step on the same batches (BARE_REPLAY: issue 21 item 4's ratio).
#   bash bench/loop_host_gpu.sh          # the phases
#   bash bench/loop_host_gpu.sh ddp      # unilm alone and under DDP with one process: the calls that wait for the
#                                        # GPU (SYNC_CHECK=1), then bench/profile_train.py on each
#   bash bench/loop_host_gpu.sh bare     # only the three runs against their bare steps (item 4)
#   bash bench/loop_host_gpu.sh gc       # PALM against its bare step as is, with gc.freeze (GC_FREEZE), with the clip
#                                        # over a list made once (FAST_CLIP), with both; then as is and both again
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUNS=/tmp/loop-host; rm -rf "$RUNS"; mkdir -p "$RUNS"
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
STEPS=${STEPS:-60}
FLAGS="--preset base --vocab_size 30522 --seq_len 512 --batch_size 32 --max_steps $STEPS --log_interval 10
  --eval_interval 100000 --ckpt_interval 100000 --progress false --overwrite true"
python -c "import data; data.prepare_pretrain(None, 30522, '.cache', max_tokens=509, progress=False)"
host() {   # host LABEL [ENV=VALUE ...] COMMAND...: one run, its table kept
  local label=$1; shift
  env LABEL="$label" "$@" > "$RUNS/$label.log" 2>&1 || { echo "$label failed:"; tail -5 "$RUNS/$label.log"; }
  grep -A15 "rank 0, steps" "$RUNS/$label.log" | tee -a "$OUT/loop_host.txt"
}
if [ "${1:-phases}" = ddp ]; then
  for mode in alone ddp1; do
    launch="python"; [ $mode = ddp1 ] && launch="torchrun --nproc_per_node 1 --master_port 29613"
    SYNC_CHECK=1 timeout 150 $launch bench/loop_host.py --objective unilm $FLAGS --out_dir "$RUNS/s$mode" 2>&1 \
      | grep -A2 "waited for the GPU" | tee -a "$OUT/syncs.txt"
    PROFILE_STOP=25 timeout 150 $launch bench/profile_train.py --objective unilm $FLAGS --out_dir "$RUNS/p$mode" \
      > "$RUNS/p$mode.log" 2>&1
    grep -A36 "rank 0, steps" "$RUNS/p$mode.log" > "$OUT/profile_$mode.txt"; head -8 "$OUT/profile_$mode.txt"
  done
  exit 0
fi
if [ "${1:-phases}" = gc ]; then
  i=0
  for v in PLAIN=1 GC_FREEZE=1 FAST_CLIP=1 "GC_FREEZE=1 FAST_CLIP=1" PLAIN=1 "GC_FREEZE=1 FAST_CLIP=1"; do
    label=palm-$(tr ' =' '_-' <<< "$v")-$((++i))
    # shellcheck disable=SC2086
    host "$label" BARE_REPLAY=1 $v timeout 150 python bench/loop_host.py --objective palm $FLAGS --out_dir "$RUNS/g"
  done
  exit 0
fi
host unilm-alone BARE_REPLAY=1 timeout 150 python bench/loop_host.py --objective unilm $FLAGS --out_dir "$RUNS/a"
host palm-alone BARE_REPLAY=1 timeout 150 python bench/loop_host.py --objective palm $FLAGS --out_dir "$RUNS/d"
host palm-nocopy-alone BARE_REPLAY=1 timeout 150 python bench/loop_host.py --objective palm --copy false $FLAGS --out_dir "$RUNS/e"
[ "${1:-phases}" = bare ] && exit 0
host unilm-ddp1 timeout 150 torchrun --nproc_per_node 1 --master_port 29611 bench/loop_host.py --objective unilm \
  $FLAGS --out_dir "$RUNS/b"
host unilm-ddp1-static 'DDP_KW={"static_graph": true}' timeout 150 torchrun --nproc_per_node 1 --master_port 29612 \
  bench/loop_host.py --objective unilm $FLAGS --out_dir "$RUNS/c"

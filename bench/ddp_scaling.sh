#!/usr/bin/env bash
# DDP scaling of train.py itself: the same per-GPU batch on 1, 2 and 4 GPUs of one host (torchrun), at the base
# preset; tokens/s from each run's own metrics.jsonl after the compilation steps, and the speed-up over 1 GPU.
#
#   bash bench/ddp_scaling.sh                  # pmlm and unilm, 60 steps each
#   OBJECTIVES="pmlm" STEPS=40 GPUS="1 2" bash bench/ddp_scaling.sh
#   GRAPH=true OUT=/tmp/ddp_graph OBJECTIVES=unilm bash bench/ddp_scaling.sh   # train.py --graph true (CUDA graphs)
#
# Several nodes: torchrun's own --nnodes N --rdzv_backend c10d --rdzv_endpoint HOST:PORT on every node (README).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ddp_scaling}
OBJECTIVES=${OBJECTIVES:-"pmlm unilm"}
STEPS=${STEPS:-60}
GPUS=${GPUS:-"1 2 4"}
GRAPH=${GRAPH:-false}
mkdir -p "$OUT"
# the vocabulary and the token cache, built once before the timed runs
python -c "import data; data.prepare_pretrain(None, 30522, '.cache', max_tokens=509, progress=False)"
for obj in $OBJECTIVES; do
  for n in $GPUS; do
    devices=$(seq -s, 0 $((n - 1)))
    CUDA_VISIBLE_DEVICES=$devices torchrun --nproc_per_node "$n" --master_port $((29500 + n)) train.py \
      --objective "$obj" --preset base --vocab_size 30522 --seq_len 512 --batch_size 32 --max_steps "$STEPS" \
      --log_interval 10 --eval_interval 100000 --ckpt_interval 100000 --progress false --overwrite true --graph "$GRAPH" \
      --out_dir "$OUT/$obj-$n" > "$OUT/$obj-$n.log" 2>&1 || { echo "$obj on $n GPU(s) failed:"; tail -20 "$OUT/$obj-$n.log"; }
  done
done
python - "$OUT" $OBJECTIVES <<'PY'
import json, statistics, sys
from pathlib import Path
out, objectives = Path(sys.argv[1]), sys.argv[2:]
print("| objective | GPUs | tokens/s | corpus tokens/s | MFU | speed-up |\n|---|---|---|---|---|---|")
for obj in objectives:
    base = None
    for run in sorted(out.glob(f"{obj}-*/metrics.jsonl"), key=lambda p: int(p.parent.name.split("-")[-1])):
        n = int(run.parent.name.split("-")[-1])
        rows = [json.loads(x) for x in run.read_text().splitlines()]
        rows = [r for r in rows if r["split"] == "train"][1:]          # after the first log: compilation
        if not rows:
            continue
        med = lambda k: statistics.median(r.get(k, float("nan")) for r in rows)
        tok = med("tokens_per_s")
        base = base or tok
        print(f"| {obj} | {n} | {tok:,.0f} | {med('corpus_tokens_per_s'):,.0f} | {med('mfu'):.1%} | {tok / base:.2f}x |")
PY

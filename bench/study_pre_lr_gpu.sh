#!/usr/bin/env bash
# Issue 22's quality bar: does the pre-training learning rate move it? One study per GPU side by side, each
# with its own --pre_lr (the study's own, 7e-4, among them), out folder and cache copy: $SYSTEMS, seed 0,
# Gigaword and SQuAD QG, fine-tuning lr 1e-3. Needs out/data (bench/study.py's docstring) and out/studycache.
#   bash bench/study_pre_lr_gpu.sh                                   # 4 GPUs: 7e-4 1.2e-3 2e-3 3e-3
#   LRS="7e-4 2e-3" SYSTEMS="pmlm,unilm" bash bench/study_pre_lr_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LRS=${LRS:-"7e-4 1.2e-3 2e-3 3e-3"}
SYSTEMS=${SYSTEMS:-pmlm}
LIMIT=${LIMIT:-8.3}
WORK=${WORK:-/tmp/pre-lr}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
# the CPU shared by every job of every study (each study alone would give its two jobs half of it)
n=$(echo $LRS | wc -w)
export OMP_NUM_THREADS=$(( $(nproc) / (2 * n) > 0 ? $(nproc) / (2 * n) : 1 ))
gpu=0
for lr in $LRS; do
  mkdir -p "$WORK/$lr/cells" "$WORK/$lr/cache" && cp -r out/studycache/. "$WORK/$lr/cache/"
  CUDA_VISIBLE_DEVICES=$gpu python bench/study.py --ft_lr 1e-3 --pre_lr "$lr" --seeds 1 --only "$SYSTEMS" \
    --gpus 1 --per_gpu 2 --time_limit_min "$LIMIT" --cells "$WORK/$lr/cells" --out "$WORK/$lr/run" \
    --cells_out "$OUT/cells-pre-lr-$lr.jsonl" --data_dir out/data --cache_dir "$WORK/$lr/cache" \
    > "$WORK/$lr.log" 2>&1 &
  gpu=$((gpu + 1))
done
wait
tail -n 3 "$WORK"/*.log
python - "$OUT" "$WORK" <<'PY'
import json, sys
from pathlib import Path
from bench import study
out, work = Path(sys.argv[1]), Path(sys.argv[2])
print("| pre-training lr | system | last pre-training loss | gigaword ROUGE-L | squad_qg BLEU-4 | squad_qg ROUGE-L |")
print("|---|---|---|---|---|---|")
for f in sorted(out.glob("cells-pre-lr-*.jsonl"), key=lambda p: float(p.stem[len("cells-pre-lr-"):])):
    lr = f.stem[len("cells-pre-lr-"):]
    cells = list(study.read_cells(f).values())
    for name in sorted({c["system"] for c in cells}):
        got = {c["task"]: c.get("scores") or {} for c in cells if c["system"] == name}
        metrics = work / lr / "run" / "work" / f"{study.slug(name)}-s0" / "pre" / "metrics.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        loss = [r["loss"] for r in rows if r.get("split") == "train" and "loss" in r]
        f1 = lambda t, m: f"{got[t][m]['f']:.2f}" if got.get(t, {}).get(m) else "-"
        print(f"| {lr} | {name} | {loss[-1] if loss else float('nan'):.4f} | {f1('gigaword', 'rougeL')} | "
              f"{f1('squad_qg', 'bleu')} | {f1('squad_qg', 'rougeL')} |")
PY

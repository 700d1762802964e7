#!/usr/bin/env bash
# Issue 22's quality bar: the study's systems under other settings, side by side. Each VARIANT is a study of
# its own (its study.py flags, out folder, cache copy and cells file), seed 0, both tasks, fine-tuning lr 1e-3,
# the study's settings otherwise; a variant's flags come last, so they win (--only, --seeds, --tasks too).
# The variants go round-robin to $GPUS GPUs; where several share one, one multi-process service (MPS) daemon
# of this script's own serves them all. Needs out/data (bench/study.py's docstring) and the caches in $CACHES.
# $OUT gets a cells file a variant and one archive of logs: the lent GPU machines bring back 8 files, so 7 variants.
#   bash bench/study_variants_gpu.sh          # the fourteenth session's run: --pre_lr 7e-4 1.2e-3 2e-3 3e-3, 4 GPUs
#   GPUS=1 VARIANTS="tapt=--corpus shared+task_sources;lr5e-4=--pre_lr 5e-4" bash bench/study_variants_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
VARIANTS=${VARIANTS:-"7e-4=--pre_lr 7e-4;1.2e-3=--pre_lr 1.2e-3;2e-3=--pre_lr 2e-3;3e-3=--pre_lr 3e-3"}
GPUS=${GPUS:-4}
SYSTEMS=${SYSTEMS:-pmlm}
PER_GPU=${PER_GPU:-2}
LIMIT=${LIMIT:-8.3}
WORK=${WORK:-/tmp/variants}
CACHES=${CACHES:-"out/studycache"}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
IFS=';' read -ra specs <<< "$VARIANTS"
n=${#specs[@]}
# the CPU shared by every job of every study (each study alone would give its jobs half of it)
export OMP_NUM_THREADS=$(( $(nproc) / (PER_GPU * n) > 0 ? $(nproc) / (PER_GPU * n) : 1 ))
if (( n > GPUS )); then
  # one daemon for every study: a study's own --mps would start one per study
  export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps/pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi
i=0
for spec in "${specs[@]}"; do
  label=${spec%%=*}
  eval "flags=(${spec#*=})"
  mkdir -p "$WORK/$label/cells" "$WORK/$label/cache"
  for c in $CACHES; do cp -r "$c"/. "$WORK/$label/cache/"; done
  CUDA_VISIBLE_DEVICES=$((i % GPUS)) python bench/study.py --ft_lr 1e-3 --seeds 1 --only "$SYSTEMS" \
    --gpus 1 --per_gpu "$PER_GPU" --time_limit_min "$LIMIT" --cells "$WORK/$label/cells" \
    --out "$WORK/$label/run" --cells_out "$OUT/cells-$label.jsonl" --data_dir out/data \
    --cache_dir "$WORK/$label/cache" "${flags[@]}" > "$WORK/$label.log" 2>&1 &
  i=$((i + 1))
done
wait
tail -n 3 "$WORK"/*.log
# every run's training log (loss, grad_norm) and the jobs' logs, in one file ($OUT brings back at most 8)
(cd "$WORK" && find . \( -name metrics.jsonl -o -name '*.log' \) -print0 | tar czf "$OUT/variants-logs.tgz" --null -T -)
python - "$OUT" "$WORK" "$VARIANTS" <<'PY'
import json, sys
from pathlib import Path
from bench import study
out, work = Path(sys.argv[1]), Path(sys.argv[2])
labels = [v.split("=", 1)[0] for v in sys.argv[3].split(";")]
print("| variant | system | seed | last pre-training loss | gigaword ROUGE-L | squad_qg BLEU-4 | squad_qg ROUGE-L |")
print("|---|---|---|---|---|---|---|")
for label in labels:
    cells = list(study.read_cells(out / f"cells-{label}.jsonl").values())
    for name, seed in sorted({(c["system"], c["seed"]) for c in cells}):
        got = {c["task"]: c for c in cells if (c["system"], c["seed"]) == (name, seed)}
        metrics = work / label / "run" / "work" / f"{study.slug(name)}-s{seed}" / "pre" / "metrics.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        loss = [r["loss"] for r in rows if r.get("split") == "train" and "loss" in r]

        def f1(task, metric):
            cell = got.get(task, {})
            if cell.get("diverged"):
                return "diverged"
            score = (cell.get("scores") or {}).get(metric)
            return f"{score['f']:.2f}" if score else "-"
        print(f"| {label} | {name} | {seed} | {loss[-1] if loss else float('nan'):.4f} | {f1('gigaword', 'rougeL')} | "
              f"{f1('squad_qg', 'bleu')} | {f1('squad_qg', 'rougeL')} |")
PY

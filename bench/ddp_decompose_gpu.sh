#!/usr/bin/env bash
# Issue 21 item 5 (DDP unilm >= 3.8x on 4 GPUs): where the speed-up is lost, one call. A GPU's step in a 4-GPU DDP
# run against one GPU alone, taken apart run by run (train.py's own loop through bench/loop_host.py, which also
# times each run's host phases; tokens/s from metrics.jsonl):
#   alone      train.py on one GPU                                  the baseline
#   ddp1       torchrun, one process: DDP's own host work, no peer
#   four       four plain train.py at once, one a GPU, no DDP        what processes sharing the host cost
#   ddp4       torchrun, four processes                              the speed-up the issue asks for (ddp2: two)
#   ddp4 ...   the same with DDP built otherwise (bench/loop_host.py, DDP_KW) or another NCCL protocol
#   *-split    the blocks cut at DDP's buckets by dynamo's DDPOptimizer, as before the seventeenth session
#   *-pin      each rank on its own quarter (half) of the host's cores (bench/loop_host.py, PIN_CPUS)
#   *-numa     torchrun --numa-binding node (where the machine has numactl)
#   pairs      ddp1 and ddp1-split at once on GPUs 0 and 1, three rounds, the cards swapped each round
#
#   bash bench/ddp_decompose_gpu.sh                     # unilm, 60 steps a run
#   OBJECTIVE=pmlm STEPS=40 bash bench/ddp_decompose_gpu.sh
#   RUNS_WANTED="alone ddp1 ddp4 ddp4-again" bash bench/ddp_decompose_gpu.sh     # some of the runs, in this order
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUNS=/tmp/ddp-decompose; rm -rf "$RUNS"; mkdir -p "$RUNS"
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
# the host's layout: which cores are near which GPU (--numa-binding, PIN_CPUS)
nvidia-smi topo -m | head -6; lscpu | grep -E "^CPU\(s\)|NUMA"; command -v numactl || echo "no numactl"
OBJECTIVE=${OBJECTIVE:-unilm}
STEPS=${STEPS:-60}
FLAGS="--objective $OBJECTIVE --preset base --vocab_size 30522 --seq_len 512 --batch_size 32 --max_steps $STEPS
  --log_interval 10 --eval_interval 100000 --ckpt_interval 100000 --progress false --overwrite true"
# the vocabulary and the token cache, built once before the timed runs
python -c "import data; data.prepare_pretrain(None, 30522, '.cache', max_tokens=509, progress=False)"
port=29600
ddp() {   # ddp NAME NPROC [ENV=VALUE ...]: torchrun over bench/loop_host.py (TORCHRUN_ARGS: torchrun's own)
  local name=$1 n=$2; shift 2
  port=$((port + 1))
  env "$@" CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout 200 torchrun --nproc_per_node "$n" \
    ${TORCHRUN_ARGS:-} --master_port $port bench/loop_host.py $FLAGS --out_dir "$RUNS/$name" > "$RUNS/$name.log" 2>&1 \
    || { echo "$name failed:"; tail -5 "$RUNS/$name.log"; }
  echo "$name done"
}
RUNS_WANTED=${RUNS_WANTED:-"alone ddp1 four ddp4 ddp4-static ddp4-bucket100 ddp4-simple ddp4-again"}
for name in $RUNS_WANTED; do
  case $name in
    alone) CUDA_VISIBLE_DEVICES=0 timeout 200 python bench/loop_host.py $FLAGS --out_dir "$RUNS/alone" \
             > "$RUNS/alone.log" 2>&1 || tail -5 "$RUNS/alone.log"; echo "alone done" ;;
    pairs) # ddp1 and ddp1-split at the same time on GPUs 0 and 1, swapped each round: the same moment, both cards
      for r in 1 2 3; do
        for g in 0 1; do
          split=$(( (g + r) % 2 )); name=pair$r-gpu$g-$([ $split = 1 ] && echo split || echo fixed)
          env SPLIT_DDP=$split CUDA_VISIBLE_DEVICES=$g timeout 200 torchrun --nproc_per_node 1 \
            --master_port $((29700 + 10 * r + g)) bench/loop_host.py $FLAGS --out_dir "$RUNS/$name" \
            > "$RUNS/$name.log" 2>&1 &
        done
        wait; echo "pairs round $r done"
      done ;;
    ddp[0-9]-split) ddp "$name" "${name:3:1}" SPLIT_DDP=1 ;;
    ddp[0-9]-pin*) ddp "$name" "${name:3:1}" PIN_CPUS=1 ;;
    ddp[0-9]-numa*) if command -v numactl > /dev/null; then TORCHRUN_ARGS="--numa-binding node" ddp "$name" "${name:3:1}"
                    else echo "$name: no numactl on this machine"; fi ;;
    four) for g in 0 1 2 3; do
            CUDA_VISIBLE_DEVICES=$g timeout 200 python bench/loop_host.py $FLAGS --out_dir "$RUNS/four$g" \
              > "$RUNS/four$g.log" 2>&1 &
          done
          wait; echo "four done" ;;
    ddp4-static) ddp ddp4-static 4 'DDP_KW={"static_graph": true}' ;;
    ddp4-bucket100) ddp ddp4-bucket100 4 'DDP_KW={"bucket_cap_mb": 100}' ;;
    ddp4-simple) ddp ddp4-simple 4 NCCL_PROTO=Simple ;;
    ddp[0-9]*) ddp "$name" "${name:3:1}" ;;
    *) echo "unknown run $name" ;;
  esac
done
grep -h -A14 "rank 0, steps" "$RUNS"/*.log > "$OUT/ddp_decompose_host.txt"
tar czf "$OUT/ddp_decompose_logs.tgz" -C "$RUNS" $(cd "$RUNS" && ls *.log)
python - "$RUNS" <<'PY' 2>&1 | tee "$OUT/ddp_decompose.txt"
import json, statistics, sys
from pathlib import Path
runs = Path(sys.argv[1])
def tok_s(name):
    path = runs / name / "metrics.jsonl"
    if not path.exists():
        return float("nan")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "train"][1:]          # after the first log: compilation
    return statistics.median(r["tokens_per_s"] for r in rows) if rows else float("nan")
base = tok_s("alone")
print("| run | GPUs | tokens/s (all GPUs) | per GPU | per GPU / alone | speed-up over alone |")
print("|---|---|---|---|---|---|")
def row(name, n, total):
    print(f"| {name} | {n} | {total:,.0f} | {total / n:,.0f} | {total / n / base:.3f} | {total / base:.2f}x |")
row("alone", 1, base)

if (runs / "four0").exists():
    four = [tok_s(f"four{g}") for g in range(4)]
    row("four (plain, at once)", 4, sum(four))
    print(f"\nfour plain processes at once, each: {', '.join(f'{t:,.0f}' for t in four)}\n")
for path in sorted(runs.glob("pair*/metrics.jsonl")):
    name = path.parent.name
    row(name, 1, tok_s(name))
for path in sorted(runs.glob("ddp[0-9]*/metrics.jsonl")):
    name = path.parent.name
    row(name, int(name[3]), tok_s(name))
PY

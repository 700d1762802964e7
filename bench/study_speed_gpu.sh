#!/usr/bin/env bash
# Issue 22's budget on one GPU: where a study pre-training's time goes, every variant in the same run.
#   bash bench/study_speed_gpu.sh          # needs out/data (the shared corpus) and out/studycache (its vocabulary,
#                                          # tokens and ERNIE-GEN's span vocabulary, built by study.py's prepare)
# Runs train.py with the study's pre-training flags (small preset, batch 128, text 256, the shared corpus) for
# STEPS steps:
#   pair_new         two processes sharing the GPU, as study.py --per_gpu 2 runs its jobs (--compile auto,
#                    one passage a row, 2 workers each): the blocks compiled for any shape (dynamic=True)
#   pair_old         the same with the blocks compiled as before (dynamic=False: once per shape)
#   alone_new        one process; alone_old: the same as before
#   eager            one process, blocks not compiled
#   four             four processes sharing the GPU (study.py --per_gpu 4)
#   pair_b256        pair_new at batch 256 and lr 1e-3 (study.py --pre_batch 256 --pre_lr 1e-3): half the steps
#   graphs           one process, the blocks replayed as CUDA graphs (reduce-overhead; an experiment, below);
#   pair_graphs      two such processes at once
#   mps_pair         pair_new under CUDA's multi-process service (a user daemon started for the variant and
#                    stopped after it; no GPU setting changes): the processes' kernels may run at the same
#                    time instead of taking turns; mps_four, mps_eight: four and eight processes so;
#                    mps_four_b256: four at batch 256
#   mps_four_pack    mps_four with --pack true (study.py --pack auto on CUDA): several passages a row, so the blocks
#                    compute almost none of the 70-78% padding of the study's batches one passage a row
#                    (bench/padding.py --data out/data/corpus --seq_len 256 --preset small --batch 128);
#                    mps_eight_pack: eight processes so
# TASK=gigaword or TASK=squad_qg runs a study control's fine-tuning instead (ft_flags), e.g.
#   TASK=squad_qg VARIANTS="mps_four mps_four_pack" bash bench/study_speed_gpu.sh
# The ninth session ran these on one H100 (bench/RESULTS.md): the processes' steps/s on the GPU
# together, alone 22.0, graphs 22.0, pair_new 29.8, four 32.3, pair_b256 34.8 (in batches of 128),
# mps_pair 34.4, mps_four 39.2, mps_eight 39.1, mps_four_b256 40.2:
#   STEPS=600 LIMIT=110 VARIANTS="pair_new mps_pair mps_four mps_eight" bash bench/study_speed_gpu.sh
# Each prints the steps/s from step FROM (the progress bar's times) and the recompilations torch logged.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-300}
OBJ=${OBJ:-ernie_gen}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
CACHE=out/studycache
SPANS=$(ls -d $CACHE/pretrain-*/span_vocab.json | head -1)
common() {  # $1: out dir. What the study's pre-training and fine-tuning jobs share
  echo --objective $OBJ --preset small --cache_dir $CACHE --out_dir $1 --progress true --overwrite true \
    --eval_interval 1000000 --eval_batches 1 --log_interval 10 --max_steps $STEPS --seed 0
}
flags() {  # $1: out dir
  if [ -n "${TASK:-}" ]; then ft_flags $1; return; fi
  echo $(common $1) --vocab_size 16384 --seq_len 256 --batch_size 128 --lr 7e-4 --data out/data/corpus \
    $([ $OBJ = ernie_gen ] && echo --span_vocab $SPANS)
}
ft_flags() {  # $1: out dir. TASK=gigaword|squad_qg: a study control's fine-tuning (from random weights, eager, batch
              # 64, lr 1e-3) on the task's training pairs, as study.py --ft_lr 1e-3 runs it
  local data=out/data/gigaword10k/train.article.txt
  [ $TASK = squad_qg ] && data=out/data/squad_qg/src-dev.txt
  echo $(common $1) --task seq2seq --data $data --vocab $CACHE/study-vocab-16384.txt --batch_size 64 --lr 1e-3 \
    --compile false
}
rate() {  # median corpus tokens/s and steps/s of a run's logged intervals after the second
  python - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"train"' in l]
tok = [r["corpus_tokens_per_s"] for r in rows[2:]]
print(f"{sys.argv[1]}: {len(rows)} intervals, corpus tokens/s median {statistics.median(tok):,.0f}, "
      f"last {tok[-1]:,.0f}" if tok else f"{sys.argv[1]}: too few intervals ({len(rows)})")
PY
}
run() {  # $1 label, then env assignments; EXTRA: more flags. SIGTERM makes train.py stop at its next log step:
         # -k kills it 10 s later if that step is far
  local label=$1; shift
  local dir=/tmp/ss/$label
  local t0=$(date +%s)
  env "$@" timeout -k 10 ${LIMIT:-170} python ${SCRIPT:-train.py} $(flags $dir) ${EXTRA:-} > $OUT/$label.log 2>&1
  echo "$label: exit $?, $(( $(date +%s) - t0 )) s"
  cp $dir/metrics.jsonl $OUT/$label.metrics.jsonl 2>/dev/null; rate $dir | tee -a $OUT/rates.txt
}
pace() {  # steps/s between step FROM and the last step, read from the progress bar's elapsed times in the log
  python - "$1" "${FROM:-50}" "$STEPS" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read().replace("\r", "\n")
seen = {}
# the training bar's (of STEPS steps; the tokenizer's bars count other things)
for step, mm, ss in re.findall(rf"(\d+)/{sys.argv[3]} \[(\d+):(\d+)", text):
    seen.setdefault(int(step), int(mm) * 60 + int(ss))
first = int(sys.argv[2]); last = max(seen)
recompiles = len(re.findall(r"Recompiling function", text))
if first in seen and last > first and seen[last] > seen[first]:
    print(f"{sys.argv[1]}: steps {first}..{last} at {(last - first) / (seen[last] - seen[first]):.1f} steps/s; "
          f"step {first} at {seen[first]} s; recompilations logged: {recompiles}")
else:
    print(f"{sys.argv[1]}: not enough steps ({last}); recompilations logged: {recompiles}")
PY
}
# the blocks as train.py compiled them before the seventh session (one passage a row, the default: dynamic=False,
# one compilation per shape), for the same-run baseline
OLD=/tmp/ss/old_train.py; mkdir -p /tmp/ss
cat > $OLD <<'PY'
import os, sys
sys.path.insert(0, os.getcwd())
import fast, train
speed_up = fast.speed_up
fast.speed_up = lambda model, compile=True, dynamic=True: speed_up(model, compile, False)
train.main(sys.argv[1:])
PY
# an experiment, not train.py: the blocks compiled with mode="reduce-overhead" (each block's forward and backward
# replayed as CUDA graphs, one per shape) and, as torch asks of a training loop, a new graph step marked before
# every optimizer step (the seventh session's try without the mark failed: "overwritten by a subsequent run")
GRAPHS=/tmp/ss/graphs_train.py
cat > $GRAPHS <<'PY'
import os, sys
sys.path.insert(0, os.getcwd())
import torch, fast, train
readable_speed_up = fast.speed_up
def speed_up(model, compile=True, dynamic=True):
    readable_speed_up(model, compile=False)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    for block in model.blocks:
        block.compile(dynamic=dynamic, mode="reduce-overhead")
    return model
fast.speed_up = speed_up
step = train.train_step
def train_step(run, autocast):
    torch.compiler.cudagraph_mark_step_begin()
    return step(run, autocast)
train.train_step = train_step
train.main(sys.argv[1:])
PY
group() {  # $1 label, $2 how many processes at once (study.py --per_gpu K), $3 a script instead of train.py,
           # or ""; EXTRA: more flags. Each process timed whole; steps/s from each one's progress bar
  local label=$1 n=$2 prog=$3 t0=$(date +%s)
  for k in $(seq 0 $(( n - 1 ))); do
    ( s=$(date +%s)
      TORCH_LOGS=recompiles timeout -k 10 ${LIMIT:-170} python ${prog:-train.py} $(flags /tmp/ss/$label$k) --seed $k \
        ${EXTRA:-} > $OUT/$label$k.log 2>&1
      echo "$label$k: exit $?, the whole process $(( $(date +%s) - s )) s" ) &
  done
  wait
  echo "$label: all $n done in $(( $(date +%s) - t0 )) s"
  for k in $(seq 0 $(( n - 1 ))); do pace $OUT/$label$k.log; done
}
mps() {  # $1 start | stop: the multi-process service's control daemon, pipes and logs under /tmp
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
  if [ $1 = start ]; then
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY && nvidia-cuda-mps-control -d && echo "mps: started"
  else
    echo quit | nvidia-cuda-mps-control; echo "mps: stopped"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}
for v in ${VARIANTS:-alone_old alone_new eager pair_new pair_old}; do
  case $v in
    pair_new) group $v 2 "" ;;
    pair_old) group $v 2 "$OLD" ;;
    four) group $v 4 "" ;;                                   # study.py --per_gpu 4
    graphs) EXTRA="" SCRIPT=$GRAPHS run $v TORCH_LOGS=recompiles; pace $OUT/$v.log ;;
    pair_graphs) group $v 2 "$GRAPHS" ;;
    pair_b256) EXTRA="--batch_size 256 --lr 1e-3" group $v 2 "" ;;   # --pre_batch 256: half the steps
    mps_pair) mps start && group $v 2 ""; mps stop ;;
    mps_four) mps start && group $v 4 ""; mps stop ;;
    mps_eight) mps start && group $v 8 ""; mps stop ;;
    mps_four_pack) mps start && EXTRA="--pack true" group $v 4 ""; mps stop ;;   # study.py --pack auto (CUDA)
    mps_eight_pack) mps start && EXTRA="--pack true" group $v 8 ""; mps stop ;;
    mps_four_b256) mps start && EXTRA="--batch_size 256 --lr 1e-3" group $v 4 ""; mps stop ;;
    alone_new) EXTRA="" run $v TORCH_LOGS=recompiles; pace $OUT/$v.log ;;
    alone_old) EXTRA="" SCRIPT=$OLD run $v TORCH_LOGS=recompiles; pace $OUT/$v.log ;;
    eager) EXTRA="--compile false" run $v X=1; pace $OUT/$v.log ;;
  esac
done

#!/usr/bin/env bash
# Quality benchmark: for each objective, pre-train on the shared corpus (Austen + Wikipedia sample + news), fine-tune
# on Gigaword 10k, decode the 1,000 validation articles with beam search and score ROUGE-1/2/L F1 (Porter stemming,
# 95% bootstrap intervals). One objective per GPU, in parallel; first a short DDP run on all GPUs.
#
#   python bench/prepare_bench_data.py            # once, on a machine that has ../shared/data
#   bash bench/gigaword.sh                        # on a 4-GPU machine (carry .bench_data)
#   PRESET=tiny PRE_STEPS=2 FT_STEPS=2 NGPU=0 bash bench/gigaword.sh    # a CPU smoke run of the same commands
#
# Everything lands in $OUT (default out/gigaword): the logs, hypotheses and scores, packed as gigaword.tgz, and a
# table printed last.
set -u
OUT=${OUT:-out/gigaword}
PRESET=${PRESET:-small}; PRE_STEPS=${PRE_STEPS:-2500}; FT_STEPS=${FT_STEPS:-1500}; NGPU=${NGPU:-4}
WORK=${WORK:-/tmp/gigaword}; LOGS=$WORK/logs
mkdir -p "$OUT" "$LOGS"
GW=.bench_data/gigaword10k
COMMON=(--preset "$PRESET" --cache_dir .cache_gpu --vocab_size 16384 --progress false)

if [ "$NGPU" -gt 1 ] && [ -z "${SKIP_DDP:-}" ]; then       # DDP on every GPU: the headline command at base size, a few steps
  python3 -m torch.distributed.run --nproc_per_node "$NGPU" train.py --objective pmlm --preset base --data .bench_data/pretrain.txt \
    --cache_dir .cache_gpu --vocab_size 16384 --progress false --seq_len 512 --batch_size 32 --max_steps 40 \
    --log_interval 10 --eval_interval 1000 --out_dir "$WORK/ddp" > "$LOGS/ddp.log" 2>&1
  tail -3 "$LOGS/ddp.log"; cp "$WORK/ddp/metrics.jsonl" "$LOGS/ddp.metrics.jsonl"
fi

pipeline() {   # objective, GPU index
  local obj=$1 d=$WORK/$1
  export CUDA_VISIBLE_DEVICES=$2 OMP_NUM_THREADS=4     # four processes share the CPU: no thread oversubscription
  python3 train.py --objective "$obj" "${COMMON[@]}" --data .bench_data/pretrain.txt --seq_len 256 --batch_size 64 \
    --max_steps "$PRE_STEPS" --lr 5e-4 --eval_interval 500 --log_interval 50 --time_limit 5.5 --out_dir "$d/pre" \
    > "$LOGS/$obj.pretrain.log" 2>&1 || return 1
  python3 train.py --task seq2seq --objective "$obj" "${COMMON[@]}" --init_from "$d/pre/ckpt.pt" \
    --data "$GW/train.article.txt" --batch_size 64 --max_steps "$FT_STEPS" --lr 3e-4 --eval_interval 400 \
    --log_interval 50 --time_limit 1.5 --out_dir "$d/ft" > "$LOGS/$obj.finetune.log" 2>&1 || return 1
  cp "$d/pre/metrics.jsonl" "$LOGS/$obj.pretrain.metrics.jsonl"; cp "$d/ft/metrics.jsonl" "$LOGS/$obj.finetune.metrics.jsonl"
  python3 generate.py --ckpt "$d/ft/ckpt.pt" --input "$GW/valid.article.txt" --output "$LOGS/$obj.valid.hyp" \
    --beam 5 --max_len 32 --length_penalty 0.6 --batch_size 100 > "$LOGS/$obj.generate.log" 2>&1 || return 1
  python3 evaluate.py rouge --pred "$LOGS/$obj.valid.hyp" --ref "$GW/valid.title.txt" --stem --bootstrap 1000 \
    --json > "$LOGS/$obj.rouge.json" 2>> "$LOGS/$obj.generate.log"
}

i=0
for obj in unilm pmlm ernie_gen palm; do
  pipeline "$obj" $(( NGPU > 0 ? i % NGPU : 0 )) &
  i=$((i + 1))
  [ "$NGPU" -gt 0 ] || wait
done
wait
tar czf "$OUT/gigaword.tgz" -C "$LOGS" .
python3 - "$LOGS" <<'EOF'
import json, sys, pathlib
logs = pathlib.Path(sys.argv[1])
print("| objective | ROUGE-1 F | ROUGE-2 F | ROUGE-L F | pre-train final valid loss |")
print("|---|---|---|---|---|")
for obj in ("unilm", "pmlm", "ernie_gen", "palm"):
    try:
        r = json.loads((logs / f"{obj}.rouge.json").read_text())
        cell = lambda k: f"{100 * r[k]['fmeasure']['mean']:.2f} [{100 * r[k]['fmeasure']['low']:.2f}, {100 * r[k]['fmeasure']['high']:.2f}]"
        pre = [json.loads(l) for l in (logs / f"{obj}.pretrain.metrics.jsonl").read_text().splitlines()]
        last = [x for x in pre if x["split"] == "valid"][-1]["loss"]
        print(f"| {obj} | {cell('rouge1')} | {cell('rouge2')} | {cell('rougeL')} | {last:.3f} |")
    except Exception as e:
        print(f"| {obj} | failed: {type(e).__name__}: {e} | | | |")
EOF

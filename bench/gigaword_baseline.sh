#!/usr/bin/env bash
# The no-pre-training control for bench/gigaword.sh: the same small model, vocabulary, fine-tuning and decoding,
# from random weights (UniLM's seq2seq fine-tuning recipe). Run after bench/prepare_bench_data.py; one GPU.
set -eu
OUT=${OUT:-out/gigaword}; WORK=${WORK:-/tmp/gigaword}; GW=.bench_data/gigaword10k
mkdir -p "$OUT" "$WORK"
VOCAB=$(ls .cache_gpu/vocab-*-16384.txt | head -1)       # the vocabulary the pre-trained runs use
python3 train.py --task seq2seq --objective unilm --preset small --vocab "$VOCAB" --cache_dir .cache_gpu \
  --data "$GW/train.article.txt" --batch_size 64 --max_steps "${FT_STEPS:-1500}" --lr 3e-4 --eval_interval 500 \
  --log_interval 50 --progress false --out_dir "$WORK/scratch" > "$OUT/scratch.finetune.log" 2>&1
python3 generate.py --ckpt "$WORK/scratch/ckpt.pt" --input "$GW/valid.article.txt" --output "$OUT/scratch.valid.hyp" \
  --beam 5 --max_len 32 --length_penalty 0.6 --batch_size 100 > /dev/null 2>&1
python3 evaluate.py rouge --pred "$OUT/scratch.valid.hyp" --ref "$GW/valid.title.txt" --stem --bootstrap 1000

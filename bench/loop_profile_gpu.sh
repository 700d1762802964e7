#!/usr/bin/env bash
# Issue 21 on one GPU, every baseline in the same run (fifth session):
#   bash bench/loop_profile_gpu.sh loop       # train.py's own loop, one passage a row vs --pack true
#                                             # (fast.SteadyPacking: one row width, blocks compiled for any row count)
#   bash bench/loop_profile_gpu.sh profile    # where a step's GPU time goes: pmlm on SDPA + bias vs on the Triton
#                                             # attention (fast/triton_bias.py); PALM with and without its copy head;
#                                             # beam-5 decoding (graphed and eager cached steps) against HF BART-base
#   bash bench/loop_profile_gpu.sh packed     # train.py's loop profiled (bench/profile_train.py), unilm one passage a
#                                             # row and packed: why packing slowed unilm's loop (0.79x) down
#   bash bench/loop_profile_gpu.sh decode     # beam 5: the whole step in one CUDA graph (fast/beam.py's WholeStep,
#                                             # generate's default on CUDA), the model step's graph with fast.beam_search
#                                             # (no host sync a step), the same graph with the readable search, the eager
#                                             # cache, and HF BART-base, same run; then check_cuda.py (graph == readable)
#   bash bench/loop_profile_gpu.sh decode_profile   # where a beam-5 step goes (wall vs GPU busy), unilm and palm,
#                                             # whole-step graph vs model-step graph + device search
#   bash bench/loop_profile_gpu.sh whole      # issue 21 item 2: bare steps with the blocks compiled (train.py's) against
#                                             # the whole forward + loss compiled as one graph (default mode, then
#                                             # CUDA graphs: reduce-overhead), with HF compiled, same run
#   bash bench/loop_profile_gpu.sh steady     # train.py's loop: one passage a row, packed at one width x64 (train.py's)
#                                             # and at one width x8, same run
#   bash bench/loop_profile_gpu.sh copy       # PALM's copy scores by Triton (speed_up's default) against compiled, and
#                                             # no copy head: bare steps, train.py's loop, beam-5 decoding; check_cuda triton
#   bash bench/loop_profile_gpu.sh triton     # pmlm's step with the Triton attention: the dQ kernel's bias gradient
#                                             # by prefix sums against the loop over buckets; then check_triton --base
#   bash bench/loop_profile_gpu.sh kernels    # issue 21 item 2: the kernels of unilm's bare step and of HF
#                                             # BertForMaskedLM compiled, same call; NO_CUDNN=1: then the same runs in a
#                                             # second process with SDPA kept off cuDNN's attention
#   bash bench/loop_profile_gpu.sh decode_phases   # beam 5 on the whole-step graph: one layer's decoding attention on
#                                             # each cache layout and SDPA backend (bench/decode_attention.py); where one
#                                             # call's time goes, phase by phase (source pass, capture, replays) and
#                                             # kernel by kernel; HF BART-base
#   bash bench/loop_profile_gpu.sh decode_rows     # beam 5 on one cache row a source (fast.beam.GROUP_BEAMS, generate's
#                                             # default) against one row a beam: check_cuda.py decode, the kernels of
#                                             # both for unilm and palm, then both rows of all four against HF BART-base
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
case "${1:-loop}" in
  loop)
    python bench/bench_train.py --part loop --pack ${PACK:-both} --multiples ${MULTIPLES:-8,16,64} --loop_steps ${STEPS:-80} --only "${ONLY:-unilm,pmlm,palm (copy)}" \
      2>&1 | tee "$OUT/bench_loop.txt" | grep -E "compiled .* graph|^\| |^part|torch|Error|error" ;;
  kernels)
    python bench/profile_step.py --part steps --cache ${CACHE:-.cache} --top ${TOP:-30} \
      --only "${ONLY:-unilm,hf}" 2>&1 | tee "$OUT/profile_kernels.txt" | grep -v USDT | tail -${TAIL:-150}
    if [ -n "${NO_CUDNN:-}" ]; then
      python bench/profile_step.py --part steps --cache ${CACHE:-.cache} --top ${TOP:-30} --no_cudnn \
        --only "${ONLY:-unilm,hf}" 2>&1 | tee "$OUT/profile_kernels_no_cudnn.txt" | grep -v USDT | tail -${TAIL:-150}
    fi ;;
  decode_phases)
    python bench/decode_attention.py 2>&1 | grep -v USDT | tail -20
    python bench/bench_generate.py --objectives ${OBJECTIVES:-unilm,palm} --rows whole --phases --profile 2>&1 \
      | tee "$OUT/decode_phases.txt" | grep -v USDT | tail -${TAIL:-200} ;;
  decode_rows)
    timeout 200 python -u bench/check_cuda.py decode 2>&1 | tee "$OUT/check_cuda_decode.txt" | grep -v USDT \
      | grep -v "| ok |$" | tail -20
    python bench/bench_generate.py --objectives unilm,palm --rows whole,whole_beam_rows --profile --no_bart \
      --repeats 2 2>&1 | tee "$OUT/decode_rows_profile.txt" | grep -E "^###|^\| unigen" | tail -20
    python bench/bench_generate.py --objectives unilm,pmlm,ernie_gen,palm --rows whole,whole_beam_rows 2>&1 \
      | tee "$OUT/bench_generate.txt" | grep -v USDT | tail -22 ;;
  profile)
    python bench/profile_step.py --part steps --only "pmlm,pmlm triton,palm (copy),palm (no copy)" 2>&1 \
      | tee "$OUT/profile_steps.txt" | tail -120
    python bench/bench_generate.py --objectives unilm,palm --profile --no_nocache --repeats 2 2>&1 \
      | tee "$OUT/profile_generate.txt" | grep -v USDT | tail -90 ;;
  packed)
    for pack in false true; do
      python bench/profile_train.py --objective unilm --preset base --seq_len 512 --batch_size 32 --max_steps 30 \
        --log_interval 10 --eval_interval 100000 --ckpt_interval 100000 --progress false --pack $pack \
        --out_dir /tmp/profile-unilm-$pack --overwrite true 2>&1 | tee "$OUT/profile_train_unilm_pack_$pack.txt" | tail -45
    done ;;
  decode)
    # the searches held equal to the readable one first (-u: what ran survives a time-out)
    timeout 200 python -u bench/check_cuda.py decode 2>&1 | tee "$OUT/check_cuda_decode.txt" | grep -v USDT | tail -60
    python bench/bench_generate.py --objectives unilm,pmlm,ernie_gen,palm --no_nocache --rows ${ROWS:-all} ${PHASES:-} \
      2>&1 | tee "$OUT/bench_generate.txt" | grep -v USDT | tail -${TAIL:-40} ;;
  copy)
    ONLY="palm (copy),palm (compiled copy),palm (no copy)"
    timeout 200 python bench/bench_train.py --part bare --impls sdpa --no_hf --steps 30 --only "$ONLY" 2>&1 \
      | tee "$OUT/bench_copy_bare.txt" | grep -E "^\| |^part|torch|Error|error"
    timeout 200 python bench/bench_train.py --part loop --pack off --loop_steps 80 --only "$ONLY" 2>&1 \
      | tee "$OUT/bench_copy_loop.txt" | grep -E "^\| |^part|torch|Error|error"
    for way in auto compiled; do
      timeout 90 python bench/bench_generate.py --objectives palm --rows whole --no_nocache --no_bart \
        --copy_scores $way 2>&1 | tee "$OUT/bench_generate_copy_$way.txt" | grep -E "^\| |Error|error"
    done
    timeout 100 python -u bench/check_cuda.py triton 2>&1 | tee "$OUT/check_cuda_triton.txt" | grep -v USDT | tail -25 ;;
  decode_profile)
    python bench/bench_generate.py --objectives unilm,palm --rows whole,device --profile --no_bart --repeats 1 2>&1 \
      | tee "$OUT/profile_generate.txt" | grep -v USDT | tail -90 ;;
  whole)
    ONLY=${ONLY:-unilm,ernie_gen}
    timeout 200 python bench/bench_train.py --part bare --impls sdpa --only "$ONLY" 2>&1 | tee "$OUT/bare_blocks.txt" \
      | grep -E "^\| |^part|torch|Error|error"
    for mode in default reduce-overhead; do
      timeout 170 python bench/bench_train.py --part bare --impls sdpa --only "$ONLY" --no_hf --whole $mode 2>&1 \
        | tee "$OUT/bare_whole_$mode.txt" | grep -E "^\| |^part|torch|Error|error"
    done ;;
  steady)
    python bench/bench_train.py --part loop --pack steady --multiples 8,64 --loop_steps ${STEPS:-60} \
      --only "${ONLY:-unilm,pmlm}" 2>&1 | tee "$OUT/bench_steady.txt" | grep -E "compiled .* graph|^\| |^part|torch|Error|error" ;;
  triton)
    python bench/profile_step.py --part steps --only "pmlm,pmlm triton,pmlm triton loop" 2>&1 \
      | tee "$OUT/profile_triton.txt" | tail -80
    timeout 200 python bench/check_triton.py --base 2>&1 | tee "$OUT/check_triton.txt" | tail -40 ;;
esac

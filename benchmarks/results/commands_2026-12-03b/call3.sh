#!/bin/bash
# Session 15, call 3: the whole GPU suite at the bf16 table's fused entry (block_p 64,
# fused_pass 1), then the prefill and ragged suites.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=420 M2V_TEST_WORKERS=12 OUT=$O bash tools/run_gpu.sh 2>&1 \
  | grep -v "^E12" | grep "passed\|failed\|FAILED\|Error\|exit" | tail -20
date -u
M2V_STAGES="prefill ragged" M2V_LIMIT_PREFILL=70 M2V_LIMIT_RAGGED=60 \
  M2V_BENCH_ARGS="--lengths=37,512,4096 --prefill_cases=chunked,highest" \
  OUT=$O bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
date -u

#!/bin/bash
# Session 14, call 1: the chunked prefill's output and C·Bᵀ kernels in row blocks (out_rows).
# Compiled prefill/packed tests, then the prefill, chunk_sweep, breakdown and ragged suites.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=200 M2V_TEST_WORKERS=8 \
  M2V_GPU_TESTS_K="PrefillCompiled or PackedCompiled or chunked" OUT=$O/t bash tools/run_gpu.sh 2>&1 \
  | grep -v "^E12" | grep "passed\|failed\|FAILED\|Error\|exit" | tail -20
cp $O/t/gpu_tests.log $O/gpu_tests.log 2>/dev/null
V="128:16:4:1:64:4:16:2:4:1:1:32:256:4:32,128:16:4:1:64:4:16:2:4:1:1:32:256:4:128,256:16:4:1:64:4:16:2:4:1:1:32:256:4:64,256:16:4:1:64:4:16:2:8:1:1:32:256:4:64,256:16:4:1:64:4:16:2:4:1:1:32:256:4:32"
M2V_STAGES="prefill chunk_sweep breakdown ragged" M2V_LIMIT_PREFILL=120 M2V_LIMIT_CHUNK_SWEEP=150 \
  M2V_LIMIT_BREAKDOWN=60 M2V_LIMIT_RAGGED=90 \
  M2V_BENCH_ARGS="--lengths=37,512,4096 --prefill_cases=chunked,highest,dense --chunk_variants=$V" \
  OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep -v "^W12" | tail -60
date -u

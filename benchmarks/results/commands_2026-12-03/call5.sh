#!/bin/bash
# Session 14, call 5: the chunks' starting states in bf16 at "bf16" products (v6): compiled
# prefill checks, the chunk sweep (out_rows 128 against 64), prefill and ragged suites.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=120 M2V_TEST_WORKERS=12 \
  M2V_GPU_TESTS_K="bolt_chunked or (PrefillCompiled and (precision or chunked_matches or bitwise)) or (PackedCompiled and oracle)" \
  OUT=$O/t bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "passed\|failed\|FAILED\|Error\|exit" | tail -8
cp $O/t/gpu_tests.log $O/gpu_tests.log
M2V_STAGES="chunk_sweep prefill ragged" M2V_LIMIT_CHUNK_SWEEP=80 M2V_LIMIT_PREFILL=60 M2V_LIMIT_RAGGED=60 \
  M2V_BENCH_ARGS="--lengths=512,4096 --prefill_cases=chunked --chunk_variants=128:16:4:1:64:4:16:2:4:1:1:32:256:4:64" \
  OUT=$O bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
rm -rf $O/t
date -u

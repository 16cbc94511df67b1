#!/bin/bash
# Session 13, call 1, run from a checkout of branch mgpu-port (c966b32) at .ab/mgpu: the
# compiled Mosaic checks on one CTA, then the loop suite (acceptance mix, conv included,
# rotating banks, B=1/8/32/128, compact default and W=32, snapshot) with the Mosaic launch,
# then the same suite with the Triton launch in the same call.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O/t $O/mosaic $O/triton
cd .ab/mgpu && export PYTHONPATH=.
date -u
M2V_STAGES="gpu_tests" M2V_GPU_TESTS_K="Mosaic" M2V_LIMIT_GPU_TESTS=110 OUT=$O/t bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "passed\|failed\|Error\|error\|exit" | tail -8
date -u
M2V_STAGES="loop" M2V_LIMIT_LOOP=250 M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32 --vary_batches=" OUT=$O/mosaic bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -24
date -u
M2V_STAGES="loop" M2V_LIMIT_LOOP=170 M2V_BENCH_ARGS="--windows=32 --vary_batches=" OUT=$O/triton bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -24
date -u

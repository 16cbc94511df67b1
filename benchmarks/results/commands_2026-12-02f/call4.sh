#!/bin/bash
# Session 12, call 4: compiled Mosaic tests (two CTAs: several items per CTA), then the
# compile probe (B=8 N=4 finished?), then the sweep at B=8/32 compact.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M2V_STAGES="gpu_tests" M2V_GPU_TESTS_K="Mosaic" M2V_LIMIT_GPU_TESTS=120 OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "passed\|failed\|Error\|error\|exit" | tail -8
timeout -k 5 60 python .ab/compile_probe.py 2>&1 | grep -v "^E12\|^W12\|^I12" | tail -8
M2V_STAGES="sweep" M2V_LIMIT_SWEEP=150 M2V_BENCH_ARGS="--sweep_modes=compact --sweep_batches=8,32 --sweep_tiles=64:4:64:mosaic=1" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -12

#!/bin/bash
# 2026-12-04, session 24 call 6, on nvidia-h200-x2 (listed late in the session): the 2-GPU
# tests on the current tree (3746264 and the session's docs commits).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi -L | tee $O/gpus.txt
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=280 M2V_TEST_WORKERS=1 M2V_GPU_TESTS_K="two_gpu" \
  OUT=$O timeout -k 10 300 bash tools/run_gpu.sh 2>&1 | tail -25
date -u

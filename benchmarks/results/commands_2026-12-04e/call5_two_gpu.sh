#!/bin/bash
# 2026-12-04 (session 22), call 5, on nvidia-h200-x2 (first lent this session): the 2-GPU
# tests on the current tree (6cb8b40 and its docs commit).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi -L | tee $O/gpus.txt
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=280 M2V_TEST_WORKERS=1 M2V_GPU_TESTS_K="two_gpu" \
  OUT=$O timeout -k 10 300 bash tools/run_gpu.sh 2>&1 | tail -25
date -u

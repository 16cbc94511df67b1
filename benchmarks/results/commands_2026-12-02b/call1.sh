#!/bin/bash
# Whole GPU suite on the current tree (HEAD 65c9fb3).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O/t
{ echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), JAX $(python3 -c 'import jax;print(jax.__version__)'), HEAD $(git rev-parse --short HEAD 2>/dev/null || echo 65c9fb3)"
  echo "# M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=480 M2V_TEST_WORKERS=10 OUT=\$O/t bash tools/run_gpu.sh"
} > $O/header.txt
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=480 M2V_TEST_WORKERS=10 OUT=$O/t bash tools/run_gpu.sh > $O/gpu_tests.log 2>&1
echo rc=$?
tail -5 $O/gpu_tests.log

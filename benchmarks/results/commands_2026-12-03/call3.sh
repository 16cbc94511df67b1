#!/bin/bash
# Session 14, call 3: the whole GPU suite (pytest -m gpu) on the committed v5 chunk kernels.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=520 M2V_TEST_WORKERS=12 OUT=$O bash tools/run_gpu.sh 2>&1 \
  | grep -v "^E12" | grep "passed\|failed\|FAILED\|Error\|exit" | tail -20
date -u

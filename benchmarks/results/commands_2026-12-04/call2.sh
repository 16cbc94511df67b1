#!/bin/bash
# Session 18, call 2: the GPU suite with a 200 s limit per test (M2V_TEST_TIMEOUT), so that the
# test that kept the last two runs from finishing is named, with its stack.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs2; rm -rf $R
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=470 M2V_TEST_WORKERS=6 M2V_TEST_TIMEOUT=200 OUT=$R \
  bash tools/run_gpu.sh 2>&1 | tail -30
cp $R/device.txt $R/gpu_tests.log $O/ 2>/dev/null
date -u

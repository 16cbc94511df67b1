#!/bin/bash
# Session 18, call 1, on commit 6459c72: the GPU suite (pytest -m gpu, 6 workers) and the
# prefill precision tool, the first GPU run of 3e330e5 (approximate silu only at bf16 products).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs1; rm -rf $R
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=430 M2V_TEST_WORKERS=6 OUT=$R bash tools/run_gpu.sh 2>&1 | tail -4
M2V_STAGES="precision" M2V_LIMIT_PRECISION=90 OUT=$R bash tools/run_gpu.sh 2>&1 | tail -15
cp $R/device.txt $R/gpu_tests.log $R/prefill_precision.json $O/ 2>/dev/null
date -u

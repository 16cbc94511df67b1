#!/bin/bash
# Session 17, call 4, on commit c964239: the GPU suite (pytest -m gpu), the sanitizer stage
# (memcheck, initcheck, synccheck, racecheck over tools/sanitize_calls.py) and the prefill
# precision tool. Only the logs worth keeping are left under $OUT (few files come back).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs4; rm -rf $R
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=380 M2V_TEST_WORKERS=8 OUT=$R bash tools/run_gpu.sh 2>&1 | tail -4
M2V_STAGES="sanitizer" OUT=$R bash tools/run_gpu.sh 2>&1 | grep "===\|ERROR SUMMARY\|hazard" | head -30
M2V_STAGES="precision" M2V_LIMIT_PRECISION=90 OUT=$R bash tools/run_gpu.sh 2>&1 | tail -15
cp $R/device.txt $R/gpu_tests.log $R/prefill_precision.json $O/ 2>/dev/null
for t in memcheck initcheck synccheck racecheck; do cp $R/sanitizer_$t.log $O/; done
date -u

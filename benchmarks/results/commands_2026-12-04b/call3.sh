#!/bin/bash
# Session 19, call 3: the GPU suite on HEAD (the fused launch reverted: the kernels are
# cba87ad's), 12 workers.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs3; rm -rf $R
date -u
M2V_STAGES="gpu_tests" OUT=$R bash tools/run_gpu.sh 2>&1 | grep -v "^I1\|^W1" | tail -40
cp $R/device.txt $R/gpu_tests.log $O/ 2>/dev/null
date -u

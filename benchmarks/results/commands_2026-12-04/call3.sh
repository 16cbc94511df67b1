#!/bin/bash
# Session 18, call 3: B=1 bf16 prefill, the verify kernels' long path ("serial") against the
# chunked path, at lengths around the chunked path's threshold.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs3; rm -rf $R
date -u
M2V_STAGES="prefill" M2V_LIMIT_PREFILL=240 OUT=$R \
  M2V_BENCH_ARGS="--lengths=24,37,48,72,136,264,512 --prefill_cases=serial,chunked" \
  bash tools/run_gpu.sh 2>&1 | grep -v "^I1\|^W1" | tail -30
cp $R/device.txt $R/prefill.json $R/prefill.log $O/ 2>/dev/null
date -u

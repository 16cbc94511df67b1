#!/bin/bash
# Next session, call 1 (branch mgpu-port): the Mosaic GPU verify launch compiled on the H200:
# its GPU tests against the Triton launch, then both launches in one process (sweep suite,
# compact then snapshot, B=8/32/128).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
git log -1 --format='commit %H %s' > $O/commit.txt 2>/dev/null
M2V_STAGES="gpu_tests sweep" M2V_GPU_TESTS_K="Mosaic" M2V_LIMIT_GPU_TESTS=200 M2V_LIMIT_SWEEP=330 \
  M2V_BENCH_ARGS="--sweep_modes=compact,snapshot --sweep_batches=8,32,128 --sweep_tiles=64:4:64:mosaic=1" \
  OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | tail -60

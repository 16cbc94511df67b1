#!/bin/bash
# 2026-12-04 (session 22), call 4: call 3's GPU suite stopped at its 330 s limit with 176 of
# 178 tests done (no failure); the longest tests of the last full run again, one worker each.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=300 M2V_TEST_WORKERS=9 \
  M2V_GPU_TESTS_K="bolt_chunked_pool_padding or bolt_pool_nan or bolt_ragged_prefill or row_counts_and_capacities or bolt_pool_reused" \
  OUT=$O timeout -k 10 330 bash tools/run_gpu.sh 2>&1 | tail -25
date -u

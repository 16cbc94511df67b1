#!/bin/bash
# Session 25, call 3: the GPU tests whose code changed after call 1 (the ragged prefill's
# padding length, the snapshot kernel's matrix, the example's decoder test).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
cat .tree 2>/dev/null | tee $O/tree.txt
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=300 \
  M2V_GPU_TESTS_K="ragged_prefill or kernel_matches_reference or speculative_equals_greedy or chunk_tiles" \
  OUT=$O timeout -k 10 320 bash tools/run_gpu.sh 2>&1 | tail -8
date -u

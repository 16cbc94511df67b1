#!/bin/bash
# Prepared 2026-12-04 for the next session's second call: the GPU suite's compact, snapshot,
# deferred and 16-bit-state tests, then the sanitizer, on the tree with
# patches/conv_early_loads.patch and patches/b1_tiles.patch applied.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git apply benchmarks/results/patches/conv_early_loads.patch benchmarks/results/patches/b1_tiles.patch || exit 1
git log -1 --format='tree at commit %H (+ conv_early_loads.patch, b1_tiles.patch)' | tee $O/commit.txt
M2V_STAGES="gpu_tests sanitizer" M2V_GPU_TESTS_K="compact or snapshot or deferred or state_dtype" \
  M2V_LIMIT_GPU_TESTS=330 M2V_LIMIT_SANITIZER=230 OUT=$O timeout -k 10 580 bash tools/run_gpu.sh 2>&1 | tail -8
git checkout m2v_jax tests
date -u

#!/bin/bash
# 2026-12-04 (session 21), call 2: the GPU suite's compact, snapshot, deferred and
# 16-bit-state tests, then the sanitizer, on main with patches/b1_tiles.patch applied
# (conv_early_loads.patch is dropped: call 1 measured it slower from B=8).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git apply benchmarks/results/patches/b1_tiles.patch || exit 1
git log -1 --format='tree at commit %H (+ b1_tiles.patch)' | tee $O/commit.txt
M2V_STAGES="gpu_tests sanitizer" M2V_GPU_TESTS_K="compact or snapshot or deferred or state_dtype" \
  M2V_LIMIT_GPU_TESTS=330 M2V_LIMIT_SANITIZER=230 OUT=$O timeout -k 10 580 bash tools/run_gpu.sh 2>&1 | tail -8
git checkout m2v_jax tests
date -u

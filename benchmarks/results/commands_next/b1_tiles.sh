#!/bin/bash
# Prepared 2026-12-04, not yet run: patches/b1_tiles.patch (compact at B=1 takes 32:4:64 from
# the tile table; measured 0.93x of the kernels' device time, bitwise equal) through the GPU
# suite's compact and snapshot tests and the loop suite at B=1 and 8. Apply the patch first:
#   git apply benchmarks/results/patches/b1_tiles.patch
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ b1_tiles.patch)' | tee $O/commit.txt
M2V_STAGES="gpu_tests" M2V_GPU_TESTS_K="compact or snapshot or lowering" OUT=$O \
  timeout -k 10 420 bash tools/run_gpu.sh 2>&1 | tail -5
PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=loop --batches=1,8 \
  --vary_batches= --blocks=11 --out=$O/loop_b1_tiles.json 2>&1 | grep -E "^\|" | tail -8
date -u

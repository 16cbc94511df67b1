#!/bin/bash
# Session 20, call 3 (2026-12-04): the loop suite at B=1 with 128 calls per dispatch and its
# kernels' device time beside each row (16 and 32 banks); then P tiles at B=1/2/4 in both
# modes (fixed rows, 64 calls per dispatch, 16 banks), to pick a tile table keyed by batch.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ uncommitted bench.py changes)' | tee $O/commit.txt
for nb in 16 32; do
  echo "### loop B=1 banks=$nb" | tee -a $O/loop_b1.txt
  PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=loop --batches=1 \
    --vary_batches= --windows=32 --banks=$nb --blocks=11 --out=$O/loop_b1_banks$nb.json \
    2>&1 | grep -E "^\|" | tail -5 | tee -a $O/loop_b1.txt
done
PYTHONPATH=$PWD timeout -k 5 330 python3 benchmarks/bench.py --suites=sweep --sweep_batches=1,2,4 \
  --sweep_tiles=32:2:64,16:2:64 --banks=16 --min_calls=64 --blocks=9 --out=$O/sweep_small_b.json \
  2>&1 | grep -E "^\||^## " | tee $O/sweep_small_b.txt | tail -30
date -u

#!/bin/bash
# Session 20, call 7 (2026-12-04): call 6's tile comparison at B=1 again with every call's
# index arrays as their own arguments (call 6 sliced them from two tables, which added device
# copies to every case's kernels' time).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ uncommitted bench.py / profile_call.py changes)' | tee $O/commit.txt
PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=loop --batches=1 \
  --vary_batches= --loop_tiles=32:4:64,32:2:64 --blocks=11 --out=$O/loop_b1_tiles.json \
  2>&1 | grep -E "^\|" | tee $O/loop_b1_tiles.txt | tail -6
date -u

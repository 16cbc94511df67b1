#!/bin/bash
# Session 20, call 4 (2026-12-04): TileConfig.touch=1 (patches/touch_ring.patch applied) in the
# loop suite (acceptance mix) at B=1 and 8, beside the table's tiles in the same process.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ touch_ring.patch and bench.py changes, uncommitted)' | tee $O/commit.txt
PYTHONPATH=$PWD timeout -k 5 280 python3 benchmarks/bench.py --suites=loop --batches=1,8 \
  --vary_batches= --loop_tiles=64:4:64:touch=1 --blocks=11 --out=$O/loop_touch.json \
  2>&1 | grep -E "^\|" | tee $O/loop_touch.txt | tail -12
date -u

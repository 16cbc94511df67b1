#!/bin/bash
# Session 20, call 6 (2026-12-04): the loop suite at B=1 with the acceptance tables passed as
# two arrays (not two per call), beside more warps per head (64:8:64) and 32-row P tiles at
# 4 warps (32:4:64); then whether those tiles give bitwise the table's results (both modes).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ uncommitted bench.py / profile_call.py changes)' | tee $O/commit.txt
PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=loop --batches=1 \
  --vary_batches= --loop_tiles=64:8:64,32:4:64 --blocks=11 --out=$O/loop_b1_tiles.json \
  2>&1 | grep -E "^\|" | tee $O/loop_b1_tiles.txt | tail -6
PYTHONPATH=$PWD timeout -k 5 150 python3 tools/tiles_bitwise.py --tiles=64:4:64,64:8:64,32:4:64 \
  2>&1 | grep -v "^I1\|^W1" | tail -4 | tee $O/tiles_bitwise.log
date -u

#!/bin/bash
# 2026-12-04 (session 21), call 7: the loop suite at B=1 (one pool of 16 entries) with the
# deferred window W=32 beside both modes, on main with the B=1 tiles.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=loop --batches=1 \
  --vary_batches= --windows=32 --blocks=11 --out=$O/loop_b1.json 2>&1 | grep -E "^\|" | tee $O/loop_b1.txt
date -u

#!/bin/bash
# Session 20, call 1 (2026-12-04): the touch-ring measurement (commands_touch/call1.sh: bitwise
# check, ncu at B=32, sweep), then the device timeline of B=1 calls in both modes.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ touch_ring.patch applied, uncommitted)' | tee $O/commit.txt
timeout -k 5 470 bash benchmarks/results/commands_touch/call1.sh
for mode in compact snapshot; do
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 80 python3 tools/trace_call.py \
    --mode=$mode --batch=1 --calls=16 --show=10 2>&1 | grep -v "^I1\|^W1" | tail -22 | tee -a $O/trace_b1.txt
done
date -u

#!/bin/bash
# Session 33, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session33_refold.sh
# Draft trees at B=32 with the snapshot program refolding a parent's state from the start
# state (the table's tiles, tree_recompute=8) against reloading the parent's slot
# (tree_recompute=0) and against 32-row P tiles; compact trees against 32-row P tiles; then
# each mode's chains and trees of 8 and 16 rows.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
git log -1 --format='commit %H %s' >> $O/device.txt 2>/dev/null
timeout -k 10 290 python3 benchmarks/bench.py --suites=tree --tree_modes=snapshot --batches=32 \
  --tree_tiles=64:4:64:tree_recompute=0,32:4:64 --out=$O/tree_snapshot.json > $O/tree_snapshot.log 2>&1
echo "snapshot exit $?"
timeout -k 10 230 python3 benchmarks/bench.py --suites=tree --tree_modes=compact --batches=32 \
  --tree_tiles=32:4:64 --out=$O/tree_compact.json > $O/tree_compact.log 2>&1
echo "compact exit $?"
grep -hE "^\| (snap|comp)|rror" $O/tree_snapshot.log $O/tree_compact.log | sort -u | cut -c1-230

#!/bin/bash
# Session 33, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session33_final.sh
# Compact draft trees at B=32 (the table's tiles and 32:4:64) with the ancestor bits computed
# in the conv launch, then the whole GPU suite (~8 minutes in all).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
timeout -k 10 130 python3 benchmarks/bench.py --suites=tree --tree_modes=compact --batches=32 \
  --tree_tiles=32:4:64 --out=$O/tree_compact.json > $O/tree_compact.log 2>&1
echo "compact exit $?"
grep -hE "^\| (snap|comp)|rror" $O/tree_compact.log | sort -u | cut -c1-150
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=${LIMIT:-440} OUT=$O/t bash tools/run_gpu.sh > $O/gpu_suite.txt 2>&1
echo "gpu suite exit $?"
grep -E "passed|failed|FAILED|ERROR|=== gpu" $O/gpu_suite.txt | tail -15

#!/bin/bash
# Session 23, call 5 (2026-12-04): the model step's kernels by device time (tools/trace_model.py,
# B=32, both modes), then the whole GPU suite, on the committed tree.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
echo "tree: $(cat .tree 2>/dev/null)" | tee $O/commit.txt
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
for mode in compact snapshot; do
  timeout -k 5 100 python3 tools/trace_model.py --mode=$mode --batch=32 2>&1 | grep -E "^\||^model" | tee $O/trace_model_$mode.txt
done
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=390 OUT=$O timeout -k 10 400 bash tools/run_gpu.sh 2>&1 \
  | grep -E "passed|failed|Error|FAILED" | tail -12
date -u

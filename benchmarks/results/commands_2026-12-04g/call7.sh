#!/bin/bash
# Session 24, call 7 (2026-12-04): tools/trace_model.py (B=32, compact) on the tree where
# in_proj rounds in the GEMM, for the per-kernel time of a model call.
set -u
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout -k 5 100 python3 tools/trace_model.py --mode=compact --batch=32 2>&1 \
  | grep -E "^\||^model|Error|rejected" | tee $OUT/trace_model_compact.txt; date -u

#!/bin/bash
# Session 23, calls 6 and 7 (2026-12-04, 14:30 UTC): tools/trace_model.py again after its
# warm-up fix (a fresh pool's first call at state_row 0), compact then snapshot. The tree: the
# commit after c934f77 with that fix (committed later with this script). Run as two calls of
# the device tool:
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false; mkdir -p $OUT
timeout -k 5 100 python3 tools/trace_model.py --mode=compact --batch=32 2>&1 \
  | grep -E "^\||^model|Error|rejected" | tee $OUT/trace_model_compact_fixed.txt; date -u
timeout -k 5 100 python3 tools/trace_model.py --mode=snapshot --batch=32 2>&1 \
  | grep -E "^\||^model|Error|rejected" | tee $OUT/trace_model_snapshot_fixed.txt; date -u

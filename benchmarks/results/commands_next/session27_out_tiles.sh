#!/bin/bash
# For a later session: the prefill output kernel's tiles at the current bf16 table entry
# (chunk 128, out_rows 64, fused pass), with more loads in flight per SM for the same
# registers: two or four heads per program with the head loop pipelined, stages alone, and
# 32-row output blocks; and the fused pass prefetching two chunks ahead (state_stages 3).
# Session 26 found both kernels waiting on their loads (benchmarks/results/session26/README.md).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
V=128:64:4:1:64:4:16:3:4:1:1:32:256:4:64:1,128:64:4:1:64:4:16:2:4:2:2:32:256:4:64:1,128:64:4:1:64:4:16:2:4:2:1:32:256:4:64:1,128:64:4:1:64:4:16:2:4:1:2:32:256:4:64:1,128:64:4:1:64:4:16:2:4:4:2:32:256:4:64:1,128:64:4:1:64:4:16:2:4:1:1:32:256:4:32:1
timeout -k 5 200 python3 benchmarks/bench.py --suites=chunk_sweep --chunk_variants=$V \
  --out=$O/chunk_sweep.json 2>&1 | grep -E "^\||Error|error" | tee $O/chunk_sweep.txt

#!/bin/bash
# Prepared 2026-12-04 (session 23) for the next session's first call: does a serial prefill
# (snapshot mode, B=1) gain from the 32-row P tiles that compact mode takes at B=1? The edit
# below gives snapshot mode the same B=1 entry (two programs a head instead of one; the
# products tile P only, so y and states should stay bitwise those of the 64-row tiles).
# Baseline, then the edit: the prefill suite's serial and chunked cases at B=1, bf16, and the
# loop suite at B=1 (snapshot and compact); then the compiled bitwise tests of both modes.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
run() {
  timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill --prefill_cases=serial,chunked \
    --lengths=24,37,48,64,72 --out=$O/prefill_$1.json 2>&1 | grep -E "^\|" | tee $O/prefill_$1.txt
  timeout -k 5 150 python3 benchmarks/bench.py --suites=loop --batches=1 --vary_batches= \
    --out=$O/loop_$1.json 2>&1 | grep -E "^\|" | tee $O/loop_$1.txt
}
run base
sed -i 's/  if batch == 1 and cfg.compact and key in _B1_COMPACT_TABLE:/  if batch == 1 and key in _B1_COMPACT_TABLE:/' m2v_jax/kernels/tiles.py
grep -n "if batch == 1" m2v_jax/kernels/tiles.py
run b1_32
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=200 M2V_GPU_TESTS_K="bitwise or serial or prefill" \
  OUT=$O timeout -k 10 220 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
git checkout m2v_jax
date -u

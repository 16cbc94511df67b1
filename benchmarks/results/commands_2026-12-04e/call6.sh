#!/bin/bash
# 2026-12-04 (session 22), call 6: deferred commit reads the pending rows as y's K dimension
# between flushes, with no fold (patches/deferred_history.patch, applied in the tree this call
# copies; a call that flushes folds as before). Baselines: earlier calls of this session and
# session 21 (the patch leaves the other kernels' Triton IR unchanged).
#  1. the compiled deferred and compact kernel tests;
#  2. loop suite, B=8,32,128, float32 and bf16 state, W=32;
#  3. ncu of the compact W=32 SSM kernel, float32 state, B=32, sixth call.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=150 M2V_GPU_TESTS_K="TestDeferredCompiled or TestCompactCompiled" \
  OUT=$O timeout -k 10 170 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error|FAIL" | tail -8
timeout -k 5 150 python3 benchmarks/bench.py --suites=loop --batches=8,32,128 --vary_batches= --blocks=9 \
  --state_dtypes=float32,bfloat16 --windows=32 --out=$O/loop.json 2>&1 | grep -E "^\|" | tee $O/loop.txt | tail -20
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
timeout -k 5 60 ncu --clock-control none --kernel-name regex:'m2v_ssm' --launch-skip 5 --launch-count 1 --metrics $M \
  python3 tools/profile_call.py --mode=compact --window=32 --batch=32 --calls=6 2>&1 \
  | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu.txt
date -u

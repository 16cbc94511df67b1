#!/bin/bash
# Session 23, call 2 (2026-12-04): the serial conv launch's body in row tiles (the working
# tree). Prefill suite B=1 bf16 serial/chunked; ncu of the conv and SSM launches at R=512 and
# R=37; the GPU tests of the serial and chunked prefills and the verify kernels.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H plus the working tree diff (git diff in diff.txt)' | tee $O/commit.txt
git diff > $O/diff.txt
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --prefill_cases=serial,chunked \
  --lengths=24,37,48,64,72,96,136,512 --out=$O/prefill.json 2>&1 | grep -E "^\|" | tee $O/prefill.txt
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
for r in 512 37; do
timeout -k 5 90 ncu --clock-control none --kernel-name regex:'m2v_(conv|ssm)' --launch-skip 2 --launch-count 2 --metrics $M \
  python3 tools/profile_call.py --prefill --nochunked --rows=$r --batch=1 --calls=2 2>&1 \
  | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_r$r.txt
done
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=240 M2V_GPU_TESTS_K="serial or prefill or kernel_matches or R_rows or state_dtype" \
  OUT=$O timeout -k 10 260 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
date -u

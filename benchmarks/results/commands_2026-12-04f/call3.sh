#!/bin/bash
# Session 23, call 3 (2026-12-04): the serial conv launch, taps loaded before the arithmetic and
# the kept rows preloaded; BODY_TILE 32 (the tree) against 16 (sed on the device).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H plus the working tree diff (git diff in diff.txt)' | tee $O/commit.txt
git diff > $O/diff.txt
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
run() {
timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --prefill_cases=serial,chunked \
  --lengths=24,37,48,56,64,72,136,512 --out=$O/prefill_$1.json 2>&1 | grep -E "^\|" | tee $O/prefill_$1.txt
for r in 512 37; do
timeout -k 5 90 ncu --clock-control none --kernel-name regex:'m2v_conv' --launch-skip 1 --launch-count 1 --metrics $M \
  python3 tools/profile_call.py --prefill --nochunked --rows=$r --batch=1 --calls=2 2>&1 \
  | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_$1_r$r.txt
done
}
run tile32
sed -i 's/^BODY_TILE = 32/BODY_TILE = 16/' m2v_jax/kernels/verify_conv.py && grep -n "^BODY_TILE" m2v_jax/kernels/verify_conv.py
run tile16
sed -i 's/^BODY_TILE = 16/BODY_TILE = 32/' m2v_jax/kernels/verify_conv.py
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=200 M2V_GPU_TESTS_K="serial or prefill or kernel_matches or R_rows" \
  OUT=$O timeout -k 10 220 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
date -u

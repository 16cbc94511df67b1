#!/bin/bash
# Ran on the tree of commit 3229851; the fused code was reverted after this call.
# Session 19, call 2: the fused kernel under ncu (B=32, B=1) after the epilogue's barrier fix,
# the compiled fused tests again, and every kernel of one compact B=1 call (all names).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
date -u
timeout -k 5 150 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -m gpu \
  tests/test_fused.py -p no:cacheprovider 2>&1 | tail -6 | tee $O/fused_tests.log
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,launch__stack_size
for B in 32 1; do
  echo "### ncu compact B=$B fused=1" | tee -a $O/ncu.txt
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
    --kernel-name regex:'m2v_ssm' --launch-skip 1 --launch-count 1 --metrics $M \
    python3 tools/profile_call.py --mode=compact --batch=$B --calls=2 --tiles=64:4:64:fused=1 2>&1 \
    | grep -E "m2v_|duration|inst_executed|issue_active|warps_active|registers|occupancy|dram|long_scoreboard|stack|rror" | tee -a $O/ncu.txt
done
echo "### every kernel, compact B=1, two-launch" | tee -a $O/ncu_all_b1.txt
PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
  --launch-skip 20 --launch-count 30 --metrics gpu__time_duration.sum \
  python3 tools/profile_call.py --mode=compact --batch=1 --calls=10 2>&1 \
  | grep -E "^  [a-zA-Z_]|duration" | tee -a $O/ncu_all_b1.txt
date -u

#!/bin/bash
# Ran on the tree of commit 9a579c6; the fused code was reverted after call 2 (it is in 3229851).
# Session 19, call 1: the one-launch verify path (TileConfig.fused) against the two launches:
# compiled bitwise tests, ncu of the SSM kernel at B=32 and B=1, and a tile sweep with fixed
# rows (b % 8) at B=1/8/32/128 in both modes.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs1; rm -rf $R; mkdir -p $R
date -u
timeout -k 5 200 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -m gpu \
  tests/test_fused.py -p no:cacheprovider 2>&1 | tail -15 | tee $O/fused_tests.log
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
for B in 32 1; do for T in 64:4:64 64:4:64:fused=1; do
  echo "### ncu compact B=$B tiles=$T" | tee -a $O/ncu.txt
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
    --kernel-name regex:'m2v_(conv|ssm)' --launch-skip 2 --launch-count 2 --metrics $M \
    python3 tools/profile_call.py --mode=compact --batch=$B --calls=1 --tiles=$T 2>&1 \
    | grep -E "m2v_|duration|inst_executed|issue_active|warps_active|registers|occupancy|dram|long_scoreboard" | tee -a $O/ncu.txt
done; done
M2V_STAGES="sweep" M2V_LIMIT_SWEEP=250 OUT=$R \
  M2V_BENCH_ARGS="--sweep_batches=1,8,32,128 --sweep_tiles=64:4:64:fused=1 --blocks=9" \
  bash tools/run_gpu.sh 2>&1 | grep -v "^I1\|^W1" | tail -30
cp $R/device.txt $R/sweep.json $R/sweep.log $O/ 2>/dev/null
date -u

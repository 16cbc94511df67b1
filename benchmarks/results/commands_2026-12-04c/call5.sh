#!/bin/bash
# Session 20, call 5 (2026-12-04): where a B=1 compact call's time goes (ncu, caches flushed
# before each kernel as ncu does by default: the loop suite's state comes from DRAM; 4 rows
# pending, as the mix's mean), then the loop suite at every batch size with W=32 and each
# row's kernels' device time.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H (+ uncommitted bench.py / profile_call.py changes)' | tee $O/commit.txt
S=smsp__average_warps_issue_stalled
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle lg_throttle no_instruction not_selected dispatch_stall membar branch_resolving selected; do
  M=$M,${S}_${r}_per_issue_active.ratio; done
for mode in compact snapshot; do
  echo "### ncu $mode B=1 state_row=3" | tee -a $O/ncu_b1.txt
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
    --kernel-name regex:'m2v_' --launch-skip 2 --launch-count 2 --metrics $M \
    python3 tools/profile_call.py --mode=$mode --batch=1 --calls=2 --state_row=3 2>&1 \
    | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee -a $O/ncu_b1.txt
done
PYTHONPATH=$PWD timeout -k 5 380 python3 benchmarks/bench.py --suites=loop --windows=32 \
  --vary_batches= --blocks=11 --out=$O/loop.json 2>&1 | grep -E "^\||^## " | tee $O/loop.txt | tail -20
date -u

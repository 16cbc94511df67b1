#!/bin/bash
# Prepared 2026-12-04 for the next session's first call: the two B=1 patches.
#  1. the loop suite (pooled B=1 sets) at B=1-128 on main as it is, beside compact at
#     32:4:64 tiles, and ncu of that SSM kernel at B=32: the baseline;
#  2. patches/conv_early_loads.patch + patches/b1_tiles.patch applied: the same loop suite,
#     then ncu of the conv kernel at B=1 and B=32 (compact);
# session21_call2.sh then runs the GPU tests on the patched tree, and the sanitizer.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H' | tee $O/commit.txt
loop() { PYTHONPATH=$PWD timeout -k 5 $2 python3 benchmarks/bench.py --suites=loop --batches=$3 \
  --vary_batches= --blocks=11 ${4:-} --out=$O/loop_$1.json 2>&1 | grep -E "^\|" | tee $O/loop_$1.txt | tail -12; }
# The baseline, and 32-row P tiles at every batch size (bitwise equal; more, smaller programs).
loop base 220 1,8,32,128 --loop_tiles=32:4:64
PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 60 ncu --clock-control none \
  --kernel-name regex:'m2v_ssm' --launch-skip 1 --launch-count 1 \
  --metrics gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 tools/profile_call.py --mode=compact --batch=32 --calls=2 --tiles=32:4:64 2>&1 \
  | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee -a $O/ncu_ssm_32x4.txt
git apply benchmarks/results/patches/conv_early_loads.patch benchmarks/results/patches/b1_tiles.patch || exit 1
loop patched 150 1,8,32
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
for B in 1 32; do
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 60 ncu --clock-control none \
    --kernel-name regex:'m2v_conv' --launch-skip 1 --launch-count 1 --metrics $M \
    python3 tools/profile_call.py --mode=compact --batch=$B --calls=2 2>&1 \
    | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee -a $O/ncu_conv.txt
done
git checkout m2v_jax tests
date -u

#!/bin/bash
# 2026-12-04 (session 22), call 1: the y product takes a 16-bit state in one (bf16) or two
# (f16) bf16 passes instead of three (patches/state_one_pass.patch, applied in the tree
# this call copies). Baseline first (the patch reversed), then the patch:
#  1. bitwise check: y and every state leaf after 5 calls, both modes, bf16 and f16 state,
#     and compact W=32 with a bf16 state (float32 states lower to the same Triton IR);
#  2. loop suite B=8,32,128, bf16 state, W=32 too;
#  3. ncu of the compact and snapshot SSM kernels at B=32, bf16 state.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
P=benchmarks/results/patches/state_one_pass.patch
git log -1 --format='tree at commit %H (+ state_one_pass.patch, reversed for the baseline)' | tee $O/commit.txt
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
bitwise() { for v in bfloat16: float16: bfloat16:--window=32; do sd=${v%%:*}; extra=${v#*:}
  timeout -k 5 90 python3 tools/tiles_bitwise.py --tiles=64:4:64 --state_dtype=$sd --batch=3 $extra \
    ${extra:+--modes=compact} $2=$O/bits_$sd${extra:+_w32}.npz 2>&1 | grep -E "bitwise|Error" | tee -a $O/bitwise_$1.txt; done; }
loop() { timeout -k 5 $2 python3 benchmarks/bench.py --suites=loop --batches=8,32,128 \
  --vary_batches= --blocks=9 --state_dtypes=bfloat16 --windows=32 --out=$O/loop_$1.json 2>&1 | grep -E "^\|" | tee $O/loop_$1.txt | tail -14; }
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
ncu_ssm() { for mode in compact snapshot; do
  timeout -k 5 60 ncu --clock-control none --kernel-name regex:'m2v_ssm' --launch-skip 1 --launch-count 1 --metrics $M \
    python3 tools/profile_call.py --mode=$mode --batch=32 --calls=2 --state_dtype=bfloat16 2>&1 \
    | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee -a $O/ncu_$1.txt; done; }
git apply -R $P || exit 1
bitwise base --save
loop base 170
ncu_ssm base
git apply $P || exit 1
bitwise patched --against
loop patched 170
ncu_ssm patched
date -u

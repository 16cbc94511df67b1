#!/bin/bash
# 2026-12-04 (session 22), call 2: deferred commit with a 16-bit state rounds the folded state
# at call boundaries under lax.cond (one branch per row) instead of computing the rounding on
# every row and selecting it (patches/fold_round_cond.patch, on top of state_one_pass.patch,
# both in the tree this call copies). Needs gpu_out/bits_bfloat16_w32.npz (carried: call 1's
# baseline run of compact W=32 with a bf16 state).
#  1. bitwise: compact W=32, bf16 state against call 1's baseline; f16 state against this
#     call's run with the patch reversed;
#  2. loop suite W=32, bf16 and f16 state, B=8,32,128: reversed, then patched;
#  3. ncu of the compact W=32 SSM kernel, bf16 state, B=32, fifth call: reversed, patched.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
P=benchmarks/results/patches/fold_round_cond.patch
git log -1 --format='tree at commit %H (+ state_one_pass.patch + fold_round_cond.patch)' | tee $O/commit.txt
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
bits() { timeout -k 5 90 python3 tools/tiles_bitwise.py --tiles=64:4:64 --modes=compact --window=32 --batch=3 "$@" 2>&1 | grep -E "bitwise|Error"; }
loop() { timeout -k 5 $2 python3 benchmarks/bench.py --suites=loop --batches=8,32,128 \
  --vary_batches= --blocks=9 --state_dtypes=bfloat16,float16 --windows=32 --out=$O/loop_$1.json 2>&1 | grep -E "^\|" | tee $O/loop_$1.txt | tail -20; }
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
ncu_w32() { timeout -k 5 60 ncu --clock-control none --kernel-name regex:'m2v_ssm' --launch-skip 5 --launch-count 1 --metrics $M \
    python3 tools/profile_call.py --mode=compact --window=32 --batch=32 --calls=6 --state_dtype=bfloat16 2>&1 \
    | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee -a $O/ncu_$1.txt; }
git apply -R $P || exit 1
bits --state_dtype=float16 --save=$O/bits_f16_w32.npz | tee -a $O/bitwise.txt
loop base 200
ncu_w32 base
git apply $P || exit 1
bits --state_dtype=float16 --against=$O/bits_f16_w32.npz | tee -a $O/bitwise.txt
bits --state_dtype=bfloat16 --against=gpu_out/bits_bfloat16_w32.npz | tee -a $O/bitwise.txt
loop patched 200
ncu_w32 patched
rm -f $O/bits_f16_w32.npz
date -u

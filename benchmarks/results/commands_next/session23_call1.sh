#!/bin/bash
# Prepared 2026-12-04 (session 22) for the next session's first call: the verify conv launch
# loads a serial prefill's body rows 8 at a time before computing them
# (patches/conv_body_groups.patch; arithmetic unchanged, so y and states should be bitwise
# those of before). Baseline first, then the patch:
#  1. prefill suite, B=1, bf16: serial and chunked at R=24..512;
#  2. ncu of the conv and SSM kernels of a serial prefill of 512 rows;
#  3. with the patch: the GPU tests of the serial and chunked prefills and the verify kernels.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
P=benchmarks/results/patches/conv_body_groups.patch
git log -1 --format='tree at commit %H (+ conv_body_groups.patch after the baseline)' | tee $O/commit.txt
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
pre() { timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill --prefill_cases=serial,chunked \
  --lengths=24,37,72,136,512 --out=$O/prefill_$1.json 2>&1 | grep -E "^\|" | tee $O/prefill_$1.txt | tail -12; }
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
prof() { timeout -k 5 90 ncu --clock-control none --kernel-name regex:'m2v_(conv|ssm)' --launch-skip 2 --launch-count 2 --metrics $M \
  python3 tools/profile_call.py --prefill --nochunked --rows=512 --batch=1 --calls=2 2>&1 \
  | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_$1.txt; }
pre base; prof base
git apply $P || exit 1
pre patched; prof patched
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=240 M2V_GPU_TESTS_K="serial or prefill or kernel_matches or R_rows" \
  OUT=$O timeout -k 10 260 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
git checkout m2v_jax
date -u

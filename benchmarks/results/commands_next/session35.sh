#!/bin/bash
# Session 35, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session35.sh CALL
#   call1: snapshot draft trees at B=32 with y after the rows (`tree_y_after=1`, alone and
#          with tree_cache=1) against the table's tiles, then ncu of the SSM launch with it
#          (~4 min on an H200; the goal is stated for the H200).
#   call2: the whole GPU suite with 16 workers and 590 s (two sessions' runs left one test
#          unfinished at 430 and 560 s with 12 workers).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
git log -1 --format='commit %H %s' >> $O/device.txt 2>/dev/null
date -u >> $O/device.txt; head -2 $O/device.txt | tail -1
case "${1:-call1}" in
call1)
  timeout -k 10 300 python3 benchmarks/bench.py --suites=tree --tree_modes=snapshot --batches=32 \
    --tree_tiles=64:4:64:tree_y_after=1,64:4:64:tree_y_after=1:tree_cache=1 \
    --out=$O/tree_y_after.json > $O/tree_y_after.log 2>&1
  echo "snapshot suite exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_y_after.log | sort -u \
    | sed 's/num_warps=4 num_stages=1 n_cols=64 block_c=128 prep_warps=4 //' | cut -c1-150
  N=gpu__time_duration.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed
  for t in 64:4:64 64:4:64:tree_y_after=1; do
    echo "=== ncu snapshot --tree --tiles=$t" | tee $O/ncu_$t.txt
    timeout -k 5 80 ncu --clock-control none --kernel-name regex:'m2v_ssm' --launch-skip 1 \
      --launch-count 1 --metrics $N python3 tools/profile_call.py --mode=snapshot --tree \
      --tiles=$t --batch=32 --rows=16 --capacity=16 --calls=1 >> $O/ncu_$t.txt 2>&1
    grep -E "gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_$t.txt \
      | sed -E 's/ +/ /g' | cut -c1-90
  done
  ;;
call2)
  M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-590} OUT=$O/t \
    bash tools/run_gpu.sh > $O/gpu_suite.txt 2>&1
  echo "gpu suite exit $?"
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/gpu_suite.txt | tail -25
  ;;
esac

#!/bin/bash
# Session 36, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session36.sh CALL
#   goal:  on an H200 (the tree issue's goals are stated for it): the tree suite at B=32 in
#          both modes, uniform and breadth-first trees, with the snapshot trees' variant
#          tree_y_after=1 timed against the table's (the root's row peeled, not yet timed on
#          the H200), then ncu of the snapshot chain's and tree's SSM launches (~6 min).
#   suite: the whole GPU suite with 16 workers and 560 s (the call's limit is 600).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
date -u >> $O/device.txt; head -2 $O/device.txt | tail -1
case "${1:-goal}" in
goal)
  timeout -k 10 260 python3 benchmarks/bench.py --suites=tree --batches=32 \
    --tree_shapes=uniform,bfs --out=$O/tree_goal.json > $O/tree_goal.log 2>&1
  echo "tree suite exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_goal.log | sort -u | cut -c1-120
  timeout -k 10 150 python3 benchmarks/bench.py --suites=tree --tree_modes=snapshot --batches=32 \
    --tree_sizes=16 --tree_tiles=64:4:64:tree_y_after=1 --out=$O/tree_y_after.json \
    > $O/tree_y_after.log 2>&1
  echo "tree_y_after exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_y_after.log | sort -u \
    | sed 's/num_warps=4 num_stages=1 n_cols=64 block_c=128 prep_warps=4 //' | cut -c1-220
  N=gpu__time_duration.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed
  i=0
  for spec in "snapshot" "snapshot --tree"; do
    i=$((i+1))
    echo "=== ncu $i: $spec" | tee $O/ncu_$i.txt
    timeout -k 5 45 ncu --clock-control none --kernel-name regex:'m2v_ssm' --launch-skip 1 \
      --launch-count 1 --metrics $N python3 tools/profile_call.py --mode=$spec --batch=32 \
      --rows=16 --capacity=16 --calls=1 >> $O/ncu_$i.txt 2>&1
    grep -E "gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_$i.txt \
      | sed -E 's/ +/ /g' | cut -c1-90
  done
  ;;
suite)
  M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-560} OUT=$O/t \
    bash tools/run_gpu.sh > $O/gpu_suite.txt 2>&1
  echo "gpu suite exit $?"
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/gpu_suite.txt | tail -25
  ;;
esac

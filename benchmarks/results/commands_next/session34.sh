#!/bin/bash
# Session 34, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session34.sh CALL
# Draft trees after session 34's offline changes: the parents' check and padding in the conv
# launch (79cdd26: a tree call is its two launches, as a chain's), the path decay sums from
# the dt program (18361fe), snapshot rows child first (c1aa6f7). Each call fits the device
# tool's 10 minutes.
#   call1: the compiled tree tests, then the compact tree suite at B=32 with block_p 32 for
#          trees and chains (~8 min).
#   call2: snapshot trees at B=32, uniform and breadth-first: the default (child first,
#          c1aa6f7) against row order (tree_order=0) and with tree_cache=1 at 64:4.
#   call3: where a compact 16-row tree's time goes: the device timeline of chain and tree
#          calls (tools/trace_call.py, kernels alone and the public path), then ncu.
#   call4: the whole GPU suite (alone: ~9 minutes on a cold machine).
#   goal:  the tree issue's goals at B=32 without variants: the compact and snapshot tree
#          suites (uniform and breadth-first trees), then ncu of the compact chain and tree
#          and the snapshot tree at R=16 (~6 min).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
git log -1 --format='commit %H %s' >> $O/device.txt 2>/dev/null
date -u >> $O/device.txt; head -2 $O/device.txt | tail -1
case "${1:-call1}" in
call1)
  timeout -k 10 240 python3 -m pytest -q -m gpu tests/test_tree.py -p no:cacheprovider \
    -p no:benchmark -n 4 > $O/gpu_tests_tree.log 2>&1
  echo "gpu tree tests exit $?"; grep -E "passed|failed|FAILED|Error" $O/gpu_tests_tree.log | tail -8
  timeout -k 10 300 python3 benchmarks/bench.py --suites=tree --tree_modes=compact --batches=32 \
    --tree_tiles=32:4:64 --tree_variant_chains --out=$O/tree_compact.json > $O/tree_compact.log 2>&1
  echo "compact suite exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_compact.log | sort -u | cut -c1-150
  ;;
call2)
  timeout -k 10 540 python3 benchmarks/bench.py --suites=tree --tree_modes=snapshot --batches=32 \
    --tree_shapes=uniform,bfs --tree_tiles=64:4:64:tree_order=0,64:4:64:tree_cache=1 \
    --out=$O/tree_snapshot.json > $O/tree_snapshot.log 2>&1
  echo "snapshot suite exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_snapshot.log | sort -u | cut -c1-150
  ;;
call3)
  for spec in "--nopublic" "--nopublic --tree" "--public" "--public --tree"; do
    f=$O/trace_$(echo $spec | tr -d ' -').txt
    timeout -k 5 100 python3 tools/trace_call.py --mode=compact --batch=32 --rows=16 \
      --capacity=16 --calls=16 --steps=3 --show=6 $spec > $f 2>&1
    echo "=== trace $spec (exit $?)"; grep -E "^per call|µs per call" $f | head -4
  done
  N=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum
  i=0
  for spec in "compact" "compact --tree" "snapshot --tree"; do
    i=$((i+1))
    echo "=== ncu $i: $spec" | tee $O/ncu_$i.txt
    timeout -k 5 75 ncu --clock-control none --kernel-name regex:'m2v_(conv|ssm)' --launch-skip 2 \
      --launch-count 2 --metrics $N python3 tools/profile_call.py --mode=$spec --batch=32 \
      --rows=16 --capacity=16 --calls=1 >> $O/ncu_$i.txt 2>&1
    grep -E "m2v_|gpu__time|inst_exec|registers|warps_active" $O/ncu_$i.txt \
      | sed -E 's/ +/ /g' | cut -c1-100
  done
  ;;
goal)
  timeout -k 10 200 python3 benchmarks/bench.py --suites=tree --batches=32 \
    --tree_shapes=uniform,bfs --out=$O/tree_goal.json > $O/tree_goal.log 2>&1
  echo "tree suite exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_goal.log | sort -u | cut -c1-120
  N=gpu__time_duration.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed
  i=0
  for spec in "compact" "compact --tree" "snapshot" "snapshot --tree"; do
    i=$((i+1))
    echo "=== ncu $i: $spec" | tee $O/ncu_$i.txt
    timeout -k 5 60 ncu --clock-control none --kernel-name regex:'m2v_(conv|ssm)' --launch-skip 2 \
      --launch-count 2 --metrics $N python3 tools/profile_call.py --mode=$spec --batch=32 \
      --rows=16 --capacity=16 --calls=1 >> $O/ncu_$i.txt 2>&1
    grep -E "m2v_|gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_$i.txt \
      | sed -E 's/ +/ /g' | cut -c1-90
  done
  ;;
call4)
  M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=${LIMIT:-560} OUT=$O/t bash tools/run_gpu.sh > $O/gpu_suite.txt 2>&1
  echo "gpu suite exit $?"
  grep -E "passed|failed|FAILED|ERROR|=== gpu" $O/gpu_suite.txt | tail -15
  ;;
esac

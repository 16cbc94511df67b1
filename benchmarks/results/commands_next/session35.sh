#!/bin/bash
# Session 35, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session35.sh CALL
# call1 ran at commit 66ff70e (an H100; ../session35/). Its `y_load` and `max_registers` tiles
# were removed after it; at later commits its variants do not parse.
#   call1: snapshot chains and draft trees at B=32, R=16: the table's tiles (the root's
#          row peeled) against y reading the start state chunk by chunk (y_load=1), alone
#          and with a register cap (max_registers=168: 3 programs an SM; 128 at n_cols 32:
#          4), trees refolded and reloaded; then ncu of the reloading tree's SSM launch
#          with the cap (~5 min on an H200).
#   call2: the whole GPU suite with 16 workers and 590 s.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
git log -1 --format='commit %H %s' >> $O/device.txt 2>/dev/null
date -u >> $O/device.txt; head -2 $O/device.txt | tail -1
case "${1:-call1}" in
call1)
  timeout -k 10 280 python3 benchmarks/bench.py --suites=tree --tree_modes=snapshot --batches=32 \
    --tree_sizes=16 \
    --tree_variant_chains --tree_tiles=64:4:64:y_load=1:max_registers=168,\
64:4:64:y_load=1:tree_recompute=0:max_registers=168,64:4:32:y_load=1:tree_recompute=0:max_registers=128 \
    --out=$O/tree_y.json > $O/tree_y.log 2>&1
  echo "snapshot suite exit $?"
  grep -hE "^\| (snap|comp)|rror" $O/tree_y.log | sort -u \
    | sed 's/num_warps=4 num_stages=1 //; s/block_c=128 prep_warps=4 //; s/tree_order=1 //' | cut -c1-170
  N=gpu__time_duration.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,launch__occupancy_limit_registers,dram__throughput.avg.pct_of_peak_sustained_elapsed
  for c in "--tree 64:4:64:y_load=1:tree_recompute=0:max_registers=168"; do
    set -- $c; tr=""; [ "$1" = "--tree" ] && tr="--tree"
    echo "=== ncu snapshot $1 --tiles=$2" | tee $O/ncu_${1#--}_$2.txt
    timeout -k 5 45 ncu --clock-control none --kernel-name regex:'m2v_ssm' --launch-skip 1 \
      --launch-count 1 --metrics $N python3 tools/profile_call.py --mode=snapshot $tr \
      --tiles=$2 --batch=32 --rows=16 --capacity=16 --calls=1 >> $O/ncu_${1#--}_$2.txt 2>&1
    grep -E "gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_${1#--}_$2.txt \
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

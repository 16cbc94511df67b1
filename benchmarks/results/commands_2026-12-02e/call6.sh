#!/bin/bash
# The Mosaic GPU launch with its operands from the conv launch (dd, the rows to fold) and L built
# in the kernel: its compiled tests against the Triton launch; every kernel of a call under ncu at
# B=32; the loop suite (B=1/8/32/128, W=32) with it; the sweep suite, Triton vs Mosaic interleaved.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M2V_STAGES="gpu_tests" M2V_GPU_TESTS_K="Mosaic" M2V_LIMIT_GPU_TESTS=150 OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "passed\|failed\|Error\|error\|exit" | tail -8
M="gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active"
run() { local name=$1; shift
  XLA_FLAGS=--xla_gpu_autotune_level=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none --launch-count 150 \
    --metrics $M --csv python tools/profile_call.py --batch=32 --calls=3 "$@" > $O/ncu_$name.csv 2> $O/ncu_$name.err
  echo "== $name rc=$?"; }
run mg_compact --mode=compact --tiles=64:4:64:mosaic=1
run mg_snapshot --mode=snapshot --tiles=64:4:64:mosaic=1
run mg_w32 --mode=compact --window=32 --tiles=64:4:64:mosaic=1
python .ab/ncu_sum.py $O/ncu_*.csv 2>&1 | grep -v "Redzone\|Delay" | tail -45
M2V_STAGES="loop sweep" M2V_LIMIT_LOOP=200 M2V_LIMIT_SWEEP=150 M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32 --vary_batches= --sweep_modes=compact --sweep_batches=32,128 --sweep_tiles=64:4:64:mosaic=1" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -24

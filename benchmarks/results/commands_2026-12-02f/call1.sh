#!/bin/bash
# Next session, call 1 (branch mgpu-port at tag mgpu-2026-12-02e-end or later): the Mosaic GPU launch with dd in
# 16-head programs and the side launch: compiled tests; every kernel of a call under ncu at B=32;
# the sweep suite, Triton vs Mosaic interleaved, both modes, B=8/32/128.
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
M2V_STAGES="sweep" M2V_LIMIT_SWEEP=240 M2V_BENCH_ARGS="--sweep_modes=compact,snapshot --sweep_batches=8,32,128 --sweep_tiles=64:4:64:mosaic=1" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -24

#!/bin/bash
# Every kernel of three calls under ncu at B=32 (XLA autotuning off so that no autotuning
# kernels are profiled): the Mosaic GPU SSM launch against the Triton one, compact and
# snapshot and W=32; then the loop suite with the Mosaic launch (bench.py's loop now honors --tiles).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M="gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active"
run() { local name=$1; shift
  XLA_FLAGS=--xla_gpu_autotune_level=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none --launch-count 150 \
    --metrics $M --csv python tools/profile_call.py --batch=32 --calls=3 "$@" > $O/ncu_$name.csv 2> $O/ncu_$name.err
  echo "== $name rc=$?"; }
run mg_compact --mode=compact --tiles=64:4:64:mosaic=1
run tr_compact --mode=compact
run mg_snapshot --mode=snapshot --tiles=64:4:64:mosaic=1
run mg_w32 --mode=compact --window=32 --tiles=64:4:64:mosaic=1
python .ab/ncu_sum.py $O/ncu_*.csv
M2V_STAGES="loop" M2V_LIMIT_LOOP=280 M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32 --vary_batches=" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|" | tail -20

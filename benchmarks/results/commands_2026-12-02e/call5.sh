#!/bin/bash
# The loop suite with the Mosaic GPU SSM launch (bench.py's loop honors --tiles now): B=1/8/32/128,
# compact default and W=32; then ncu's stall samples by SASS instruction for its compact kernel at
# B=32, default and W=32.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M2V_STAGES="loop" M2V_LIMIT_LOOP=330 M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32 --vary_batches=" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -20
for w in 0 32; do
  wa=""; [ $w = 0 ] || wa="--window=$w"
  echo "=== ncu source w=$w $(date -u +%T)"
  XLA_FLAGS=--xla_gpu_autotune_level=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_mgpu --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy -f -o $O/src_w$w \
    python tools/profile_call.py --mode=compact --batch=32 --calls=3 --tiles=64:4:64:mosaic=1 $wa > $O/src_w$w.log 2>&1; echo "exit $?"
  timeout 60 ncu --import $O/src_w$w.ncu-rep --page details > $O/details_w$w.txt 2>&1
  timeout 60 ncu --import $O/src_w$w.ncu-rep --page source --csv --print-source sass > $O/src_w$w.csv 2>&1; echo "csv exit $?"
  grep -i "duration\|registers\|Executed Ipc\|Memory Throughput\|DRAM Throughput\|Warp Cycles Per Issued\|Achieved Occupancy" $O/details_w$w.txt | head -12
  rm -f $O/src_w$w.ncu-rep
done

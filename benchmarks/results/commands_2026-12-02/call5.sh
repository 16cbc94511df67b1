#!/usr/bin/env bash
# Call 5 (2026-12-02, seventh session): conv channels per program (block_c) sweep and ncu of the conv kernel.
set -u
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > $OUT/device.txt 2>&1
echo "command: OUT=... bash .ab/call5.sh (working tree of 0e36d8d + TileConfig text with name=value)" >> $OUT/device.txt
for bc in 128 512; do
  echo "== block_c $bc" >> $OUT/conv_ncu_b32.txt
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none --kernel-name regex:m2v_conv --launch-skip 1 --launch-count 1 --metrics $M python3 tools/profile_call.py --mode=compact --batch=32 --calls=1 --tiles=64:4:64:block_c=$bc >> $OUT/conv_ncu_b32.txt 2>&1
  echo "ncu $bc rc $? $(date -u +%T)" >> $OUT/device.txt
done
timeout -k 5 300 python3 benchmarks/bench.py --suites=sweep --sweep_batches=32,128 --sweep_modes=compact \
  --sweep_tiles=64:4:64:block_c=256,64:4:64:block_c=512,64:4:64:block_c=1024 --out=$OUT/conv_sweep.json > $OUT/conv_sweep.log 2>&1
echo "sweep rc $? $(date -u +%T)" >> $OUT/device.txt
cd $OUT && tar czf all.tgz *.txt *.log *.json 2>/dev/null; ls

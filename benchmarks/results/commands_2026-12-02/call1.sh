#!/usr/bin/env bash
# Call 1 (2026-12-02, seventh session): v11 sweep and ncu.
set -u
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,launch__shared_mem_per_block_dynamic
cd .ab/v11
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > $OUT/device.txt 2>&1
echo "command: OUT=... bash .ab/call1.sh (v11 = HEAD 77c0047 + diff c038c41..88b7765)" >> $OUT/device.txt
timeout -k 5 330 python3 benchmarks/bench.py --suites=sweep --sweep_batches=8,32,128 --sweep_modes=compact \
  --sweep_tiles=64:4:64:2:1,64:4:64:2:2,64:4:64:2:4 --out=$OUT/v11_sweep.json > $OUT/v11_sweep.log 2>&1
echo "sweep rc $? $(date -u +%T)" >> $OUT/device.txt
for t in 64:4:64 64:4:64:2:4 64:4:64:2:2; do
  echo "== tiles $t" >> $OUT/v11_ncu.txt
  timeout -k 5 100 ncu --clock-control none --metrics $M -k regex:m2v_ssm -c 2 python3 tools/profile_call.py --mode=compact --batch=32 --calls=1 --tiles=$t >> $OUT/v11_ncu.txt 2>&1
  echo "ncu $t rc $? $(date -u +%T)" >> $OUT/device.txt
done
cd $OUT && tar czf all.tgz *.txt *.log *.json 2>/dev/null; ls

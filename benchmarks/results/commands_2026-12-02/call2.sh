#!/usr/bin/env bash
# Call 2 (2026-12-02, seventh session): v12 (snapshot reload) sweep and ncu; every kernel of one call.
set -u
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
cd .ab/v12
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > $OUT/device.txt 2>&1
echo "command: OUT=... bash .ab/call2.sh (v12 = HEAD 77c0047 + TileConfig.reload_start, snapshot only)" >> $OUT/device.txt
# ncu first (short), the pool not preallocated
for t in 64:4:64 64:4:64:1:1; do
  echo "== snapshot tiles $t" >> $OUT/v12_ncu.txt
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none --kernel-name regex:m2v_ssm --launch-skip 1 --launch-count 1 --metrics $M python3 tools/profile_call.py --mode=snapshot --batch=32 --calls=1 --tiles=$t >> $OUT/v12_ncu.txt 2>&1
  echo "ncu $t rc $? $(date -u +%T)" >> $OUT/device.txt
done
echo "== every kernel, compact B=32 (launch order; first call is the warm-up)" >> $OUT/all_kernels.txt
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none --metrics gpu__time_duration.sum python3 tools/profile_call.py --mode=compact --batch=32 --calls=2 >> $OUT/all_kernels.txt 2>&1
echo "ncu all rc $? $(date -u +%T)" >> $OUT/device.txt
timeout -k 5 300 python3 benchmarks/bench.py --suites=sweep --sweep_batches=8,32,128 --sweep_modes=snapshot \
  --sweep_tiles=64:4:64:1:1 --out=$OUT/v12_sweep.json > $OUT/v12_sweep.log 2>&1
echo "sweep rc $? $(date -u +%T)" >> $OUT/device.txt
cd $OUT && tar czf all.tgz *.txt *.log *.json 2>/dev/null; ls

#!/bin/bash
# Ninth session, call 2: the Mosaic GPU compact-step prototype (check, timing, ncu); chunked breakdown and chunk tiles on v4.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
run() { local name=$1 lim=$2; shift 2
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  timeout -k 10 $lim "$@" > $O/$name.log 2>&1
  echo "=== $name exit $? $(date -u +%H:%M:%S)" | tee -a $O/log.txt; tail -12 $O/$name.log; }
export PYTHONPATH=.
run mg_proto 150 python3 .ab/mg_proto.py $O/mg_proto.json
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__shared_mem_per_block_dynamic,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
XLA_PYTHON_CLIENT_PREALLOCATE=false run mg_proto_ncu 120 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu
run v4_breakdown 150 python3 benchmarks/bench.py --copy_mib=256 --suites=breakdown --out=$O/v4_breakdown.json
python3 -c "
import json; d=json.load(open('$O/v4_breakdown.json'))['breakdown']
print({k: v for k, v in d.items() if 'chunked' in k})" 2>&1 | cut -c1-2500
run v4_chunk_sweep 170 python3 benchmarks/bench.py --copy_mib=2048 --suites=chunk_sweep --chunk_variants=128:16:4:1:64:4:16:2:8:1:1,128:16:4:1:64:8:16:2:8:1:1,256:16:4:1:64:8:16:2:8:1:1 --out=$O/v4_chunk_sweep.json

#!/bin/bash
# Tenth session, call 7: wsf (wse with the library's elementwise fold over 5 pending rows read as
# the window holds them, bf16 x and B rows): loop and ncu.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u > $O/device.txt
F="grep -v ^E1202\|Source.Location\|cuda_status.cc\|^$"
for v in wsf132x4x4; do echo "=== $v $(date -u +%T)"; MG_VARIANT=$v timeout -k 5 60 python3 .ab/mg_proto.py $O/mg_$v.json 2>&1 | $F | tail -5; done
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
for v in wsf132x4x4; do echo "=== ncu $v $(date -u +%T)"
  MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 50 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu > $O/ncu_$v.txt 2>&1
  grep -v "^==\|^E12" $O/ncu_$v.txt | grep -v "^ *$" | tail -11 | sed 's/  */ /g'; done

#!/bin/bash
# Tenth session, call 2: wsr (S1 and y stored from registers, y's head and tail through the
# item's own slot) with 2 and 3 consumer warpgroups, loop and ncu (stall reasons included).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u > $O/device.txt
F="grep -v ^E1202\|Source.Location\|cuda_status.cc\|^$"
for v in wsr132x4c2 wsr132x5c3 wsr132x3c3 ws132x4; do echo "=== $v $(date -u +%T)"; MG_VARIANT=$v timeout -k 5 60 python3 .ab/mg_proto.py $O/mg_$v.json 2>&1 | $F | tail -6; done
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__shared_mem_per_block_dynamic,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio
for v in wsr132x4c2 wsr132x5c3 wsr132x3c3 ws132x4; do echo "=== ncu $v $(date -u +%T)"
  MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 50 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu > $O/ncu_$v.txt 2>&1
  grep -v "^==\|^E12" $O/ncu_$v.txt | grep -v "^ *$" | tail -22 | sed 's/  */ /g'; done

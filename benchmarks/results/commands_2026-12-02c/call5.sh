#!/bin/bash
# Ninth session, call 5: register-operand Mosaic GPU prototypes (bf16 parts, state slot refilled at once) against the two-stage TMA one; ncu at B=32.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
run() { local name=$1 lim=$2; shift 2
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  timeout -k 10 $lim "$@" > $O/$name.log 2>&1
  echo "=== $name exit $? $(date -u +%H:%M:%S)" | tee -a $O/log.txt; grep -v "^E1202\|Source Location\|cuda_status.cc\|^$" $O/$name.log | tail -6; }
export PYTHONPATH=.
for v in regs264x2 regs396x1 regs132x4 pipe264x2 regs264x2; do MG_VARIANT=$v run mg_$v 70 python3 .ab/mg_proto.py $O/mg_$v.json; done
M=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__shared_mem_per_block_dynamic,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__inst_executed_op_global_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
for v in regs264x2 regs396x1; do MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false run mg_ncu_$v 80 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu; done

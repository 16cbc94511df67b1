#!/bin/bash
# Tenth session, call 6: wse (the state ring apart from the operands' ring; a state slot freed
# once the state is in registers) with 4 and 3 state slots: loop, ncu, stalls by instruction.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u > $O/device.txt
F="grep -v ^E1202\|Source.Location\|cuda_status.cc\|^$"
for v in wse132x4x3 wse132x3x3; do echo "=== $v $(date -u +%T)"; MG_VARIANT=$v timeout -k 5 60 python3 .ab/mg_proto.py $O/mg_$v.json 2>&1 | $F | tail -5; done
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
for v in wse132x4x3 wse132x3x3; do echo "=== ncu $v $(date -u +%T)"
  MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 50 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu > $O/ncu_$v.txt 2>&1
  grep -v "^==\|^E12" $O/ncu_$v.txt | grep -v "^ *$" | tail -9 | sed 's/  */ /g'; done
v=wse132x4x3; echo "=== ncu source $v $(date -u +%T)"
MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats -f -o $O/src_$v python3 .ab/mg_proto.py ncu > $O/src_$v.log 2>&1; echo "exit $?"
timeout 60 ncu --import $O/src_$v.ncu-rep --page source --csv --print-source sass > $O/src_$v.csv 2>&1; echo "csv exit $?"
rm -f $O/src_$v.ncu-rep

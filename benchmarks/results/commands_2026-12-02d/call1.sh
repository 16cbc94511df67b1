#!/bin/bash
# Tenth session, call 1: the warp-specialized Mosaic GPU step (ws132x4) in the loop and under ncu
# with dram__bytes and rotating entries, the earlier variants re-profiled the same way, and the
# sanitizer stage on the current tools/sanitize_calls.py.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u > $O/device.txt; git log -1 --format='commit %H' >> $O/device.txt 2>/dev/null
F="grep -v ^E1202\|Source.Location\|cuda_status.cc\|^$"
for v in ws132x4 ws132x2; do echo "=== $v $(date -u +%T)"; MG_VARIANT=$v timeout -k 5 60 python3 .ab/mg_proto.py $O/mg_$v.json 2>&1 | $F | tail -6; done
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__shared_mem_per_block_dynamic
for v in ws132x4 pipe264x2 pipecopy132x6 full; do echo "=== ncu $v $(date -u +%T)"
  MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 50 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu > $O/ncu_$v.txt 2>&1
  grep -v "^==\|^E12" $O/ncu_$v.txt | tail -11; done
echo "=== sanitizer $(date -u +%T)"
M2V_STAGES=sanitizer OUT=$O/san timeout -k 10 300 bash tools/run_gpu.sh > $O/sanitizer_stage.log 2>&1
echo "exit $? $(date -u +%T)"; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|=== sanitizer\|exit" $O/sanitizer_stage.log $O/san/*.log 2>/dev/null | tail -20

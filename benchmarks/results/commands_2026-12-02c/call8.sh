#!/bin/bash
# Ninth session, call 8: persistent TMA copies of the states (no compute) with 1, 2 and 5 loads ahead: the streaming ceiling of the structure.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
for v in pipecopy264x2 pipecopy264x3 pipecopy132x6; do echo "=== $v $(date -u +%T)"; MG_VARIANT=$v timeout -k 5 40 python3 .ab/mg_proto.py $O/mg_$v.json 2>&1 | grep -v "^E1202\|Source Location\|cuda_status.cc\|^$" | tail -5; done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__shared_mem_per_block_dynamic,sm__warps_active.avg.pct_of_peak_sustained_active
MG_VARIANT=pipecopy132x6 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 40 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu 2>&1 | grep -v "^==\|^E12" | tail -6

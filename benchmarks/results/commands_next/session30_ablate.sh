#!/bin/bash
# Session 30, call 3: where the compact SSM kernel's time goes at B=32. ncu of the kernel as
# it is and of four copies that leave out one part of its work (`ablate_ssm.py`: rows1, the
# fold's row loads all of one row; nofold; noy; copy), then the stalls per SASS instruction
# of the kernel as it is (SourceCounters, CSV). From the repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session30_ablate.sh
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_next
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,l1tex__t_sector_hit_rate.pct
python3 $D/ablate_ssm.py /tmp/abl || exit 1
for v in base rows1 nofold noy copy; do
  P=$PWD; [ $v = base ] || P=/tmp/abl/$v:$PWD
  echo "=== ncu $v $(date -u +%T)"
  PYTHONPATH=$P timeout -k 5 90 ncu --clock-control none --kernel-name regex:m2v_ssm \
    --launch-skip 1 --launch-count 1 --metrics $M python3 tools/profile_call.py --mode=compact \
    --batch=32 --calls=1 2>&1 | grep -E "m2v_|  [a-z0-9_]+__" | sed 's/  */ /g'
done 2>&1 | tee $O/ncu_ablate.txt
echo "=== ncu source $(date -u +%T)"
PYTHONPATH=$PWD timeout -k 5 120 ncu --clock-control none --kernel-name regex:m2v_ssm \
  --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats \
  -f -o /tmp/src_base python3 tools/profile_call.py --mode=compact --batch=32 --calls=1 \
  > $O/src_base.log 2>&1
timeout -k 5 60 ncu --import /tmp/src_base.ncu-rep --page source --csv --print-source sass \
  > /tmp/src_base.csv 2>&1; gzip -c /tmp/src_base.csv > $O/src_base.csv.gz; ls -la $O
echo "=== done $(date -u +%T)"

#!/bin/bash
# Session 26, call 1: where the chunked prefill's output kernel and fused chunk-states pass
# spend their instructions and stalls (ncu SourceCounters by SASS instruction), R=4096, B=1,
# bf16, snapshot; and the short metric list for all four chunk kernels as a baseline.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
cat .tree 2>/dev/null | tee $O/tree.txt
date -u | tee $O/date.txt
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,sm__warps_active.avg.pct_of_peak_sustained_active
P="python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1"
echo "=== metrics $(date -u +%T)"
timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_chunk --launch-skip 6 \
  --launch-count 6 --metrics $M $P 2>&1 | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_metrics.txt
for k in out states_pass; do
  echo "=== source $k $(date -u +%T)"
  timeout -k 5 150 ncu --clock-control none --kernel-name regex:m2v_chunk_$k --launch-skip 1 \
    --launch-count 1 --section SourceCounters --section WarpStateStats -f -o $O/src_$k $P \
    > $O/src_$k.log 2>&1; echo "exit $?"
  timeout 60 ncu --import $O/src_$k.ncu-rep --page source --csv --print-source sass > $O/src_$k.csv 2>&1
  echo "csv exit $? $(wc -l < $O/src_$k.csv) lines"
  timeout 60 ncu --import $O/src_$k.ncu-rep --page details > $O/src_${k}_details.txt 2>&1
  rm -f $O/src_$k.ncu-rep
  gzip -f $O/src_$k.csv
done
date -u

#!/bin/bash
# Tenth session, call 3: ws132x4's stalls by SASS instruction (ncu SourceCounters), and wsp132x4
# (the next item's entry and decay loaded one item ahead) in the loop and under ncu.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u > $O/device.txt
F="grep -v ^E1202\|Source.Location\|cuda_status.cc\|^$"
for v in wsp132x4 ws132x4; do echo "=== $v $(date -u +%T)"; MG_VARIANT=$v timeout -k 5 60 python3 .ab/mg_proto.py $O/mg_$v.json 2>&1 | $F | tail -5; done
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
echo "=== ncu wsp132x4 $(date -u +%T)"
MG_VARIANT=wsp132x4 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 50 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --metrics $M python3 .ab/mg_proto.py ncu 2>&1 | grep -v "^==\|^E12" | grep -v "^ *$" | tail -7 | sed 's/  */ /g'
for v in ws132x4; do echo "=== ncu source $v $(date -u +%T)"
  MG_VARIANT=$v XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none --kernel-name regex:mgpu_proto --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats -f -o $O/src_$v python3 .ab/mg_proto.py ncu > $O/src_$v.log 2>&1; echo "exit $?"
  timeout 60 ncu --import $O/src_$v.ncu-rep --page source --csv --print-source sass > $O/src_$v.csv 2>&1; echo "csv exit $? $(wc -l < $O/src_$v.csv) lines"
  timeout 60 ncu --import $O/src_$v.ncu-rep --page details > $O/src_${v}_details.txt 2>&1
  rm -f $O/src_$v.ncu-rep
  python3 - $O/src_$v.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if any("Source" == c for c in r) or any("Address" in c for c in r))
h = rows[hdr]; print(h[:12])
body = rows[hdr + 1:]
def col(name):
  for i, c in enumerate(h):
    if c == name: return i
samp = col("Warp Stall Sampling (All Samples)") or col("Warp Stall Sampling (All Cycles)")
src = col("Source")
if samp is None: print("no sampling column", h); sys.exit()
tot = sum(float(r[samp] or 0) for r in body if len(r) > samp)
top = sorted(body, key=lambda r: -float(r[samp] or 0) if len(r) > samp else 0)[:40]
for r in top: print(f"{float(r[samp])/tot*100:5.1f}%  {r[src]}")
PY
done

#!/bin/bash
# Per-kernel times (profiler trace) of a chunked prefill R=4096, HEAD's tree and this tree.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
ROOT=$(pwd)
run() { local name=$1 dir=$2 lim=$3; shift 3
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  ( cd $dir && timeout -k 10 $lim "$@" ) > $O/$name.log 2>&1
  echo "=== $name exit $? $(date -u +%H:%M:%S)" | tee -a $O/log.txt; }
B="env PYTHONPATH=. python3 benchmarks/bench.py --copy_mib=256"
run old_breakdown .ab/old 150 $B --suites=breakdown --out=$O/old_breakdown.json
run new_breakdown $ROOT 150 $B --suites=breakdown --out=$O/new_breakdown.json
python3 - <<'PY'
import json, os
O = os.environ.get("OUT", "/tmp/out")
for t in ("old", "new"):
  d = json.load(open(f"{O}/{t}_breakdown.json"))["breakdown"]
  for k, v in d.items():
    if "chunked" in k:
      print(t, k, json.dumps(v)[:3000])
PY

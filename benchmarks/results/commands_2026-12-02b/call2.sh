#!/bin/bash
# A/B: prefill and ragged suites on HEAD's tree (.ab/old) and this tree; then the compiled
# packed/prefill tests on this tree.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
ROOT=$(pwd)
run() { # name dir limit cmd...
  local name=$1 dir=$2 lim=$3; shift 3
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  ( cd $dir && timeout -k 10 $lim "$@" ) > $O/$name.log 2>&1
  echo "=== $name exit $? $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  tail -12 $O/$name.log
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $O/device.txt
B="env PYTHONPATH=. python3 benchmarks/bench.py --prefill_cases=chunked,highest,dense --copy_mib=2048"
run old_prefill .ab/old 200 $B --suites=prefill --out=$O/old_prefill.json
run new_prefill $ROOT 200 $B --suites=prefill --out=$O/new_prefill.json
run old_ragged .ab/old 200 $B --suites=ragged --out=$O/old_ragged.json
run new_ragged $ROOT 240 $B --suites=ragged --out=$O/new_ragged.json
# gpu tests: passed in the first run of this script (05:41-05:42 UTC)

#!/bin/bash
# v3: unmasked whole-chunk y stores, the tails written in place.
# breakdown, then the compiled packed/prefill tests.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
run() { local name=$1 lim=$2; shift 2
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  timeout -k 10 $lim "$@" > $O/$name.log 2>&1
  echo "=== $name exit $? $(date -u +%H:%M:%S)" | tee -a $O/log.txt; tail -14 $O/$name.log; }
B="env PYTHONPATH=. python3 benchmarks/bench.py --prefill_cases=chunked,highest,dense --copy_mib=2048"
run v3_prefill 200 $B --suites=prefill --out=$O/v3_prefill.json
run v3_ragged 240 $B --suites=ragged --out=$O/v3_ragged.json
run v3_breakdown 150 env PYTHONPATH=. python3 benchmarks/bench.py --copy_mib=256 --suites=breakdown --out=$O/v3_breakdown.json
python3 -c "
import json; d=json.load(open('$O/v3_breakdown.json'))['breakdown']
print({k: v for k, v in d.items() if 'chunked' in k})" 2>&1 | cut -c1-1500
XLA_PYTHON_CLIENT_PREALLOCATE=false run gpu_tests 200 python3 -m pytest -q -m gpu tests -k "prefill or Prefill or Packed or chunk or mixer or Mixer or hf or Hf or sharded" -p no:cacheprovider -p no:benchmark -n 10

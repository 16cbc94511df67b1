#!/bin/bash
# Ninth session, call 1: Mosaic GPU smoke on JAX 0.11.2; compiled packed/prefill tests; prefill and ragged suites on v4.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
run() { local name=$1 lim=$2; shift 2
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a $O/log.txt
  timeout -k 10 $lim "$@" > $O/$name.log 2>&1
  echo "=== $name exit $? $(date -u +%H:%M:%S)" | tee -a $O/log.txt; tail -12 $O/$name.log; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; git log -1 --format='commit %H %s'; } > $O/device.txt 2>&1
export PYTHONPATH=.
run mg_smoke 60 python3 .ab/mg_smoke.py
XLA_PYTHON_CLIENT_PREALLOCATE=false run gpu_tests_packed 170 python3 -m pytest -q -m gpu tests/test_packed.py tests/test_prefill.py -p no:cacheprovider -p no:benchmark -n 8
B="python3 benchmarks/bench.py --prefill_cases=chunked,highest,dense --copy_mib=2048"
run v4_prefill 150 $B --suites=prefill --out=$O/v4_prefill.json
run v4_ragged 170 $B --suites=ragged --out=$O/v4_ragged.json

#!/usr/bin/env bash
# Every GPU check and benchmark in one run (one device call). Results go to $OUT
# (default ./gpu_out): device.txt, gpu_tests.log, suite_tests.log, bench.json, bench.log.
#   OUT=/tmp/gpu bash tests/run_gpu.sh [bench suites, default main,batch,prefill,breakdown]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
SUITES=${1:-main,batch,prefill,breakdown}
FULL=${FULL_SUITE:-1}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  git log -1 --format='commit %H %s' 2>/dev/null; } 2>&1 | tee "$OUT/device.txt"
status=0
$PY -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" || status=1
$PY -m m2v_jax.bench --suites="$SUITES" --out="$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || status=1
if [ "$FULL" = 1 ]; then
  # the CPU suite, compiled on the GPU (the backend fixture picks "pallas")
  $PY -m pytest -q -x tests -p no:cacheprovider -m "not gpu" 2>&1 | tee "$OUT/suite_tests.log" || status=1
fi
exit $status

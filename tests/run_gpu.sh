#!/usr/bin/env bash
# Every GPU check and benchmark in one run (one device call). Results go to $OUT
# (default ./gpu_out): device.txt and a log per stage, bench.json, prefill.json, sweep.json. Each stage has its own time limit (seconds, M2V_LIMIT_*).
#   OUT=/tmp/gpu bash tests/run_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
status=0
stage() {  # stage NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s) ==="
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc ==="
  [ "$rc" = 0 ] || status=1
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  git log -1 --format='commit %H %s' 2>/dev/null; } 2>&1 | tee "$OUT/device.txt"
stage gpu_tests "${M2V_LIMIT_TESTS:-110}" $PY -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
stage bench "${M2V_LIMIT_BENCH:-170}" $PY -m m2v_jax.bench --suites=main,breakdown,batch \
  --out="$OUT/bench.json"
stage prefill "${M2V_LIMIT_PREFILL:-100}" $PY -m m2v_jax.bench --suites=prefill --out="$OUT/prefill.json"
stage decode_snapshot "${M2V_LIMIT_DECODE:-40}" $PY examples/decode.py --replay_mode=snapshot \
  --max_new_tokens=400
stage decode_compact "${M2V_LIMIT_DECODE:-40}" $PY examples/decode.py --replay_mode=compact \
  --max_new_tokens=400 --quiet
stage sweep "${M2V_LIMIT_SWEEP:-60}" $PY -m m2v_jax.bench --suites=sweep --out="$OUT/sweep.json"
stage suite_tests "${M2V_LIMIT_SUITE:-50}" $PY -m pytest -q -x tests -m "not gpu" -p no:cacheprovider
exit $status

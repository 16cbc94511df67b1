#!/usr/bin/env bash
# Every GPU check and benchmark in one run (one device call). Results go to $OUT (default
# ./gpu_out): device.txt, a log per stage, and bench.json, batch.json, prefill.json, sweep.json,
# chunk_sweep.json.
# M2V_STAGES picks stages (default: all, in this order); M2V_LIMIT_<STAGE> caps a stage's
# seconds; M2V_GPU_TESTS_K filters the GPU tests (pytest -k); M2V_SWEEP_ARGS adds flags to the
# sweep (e.g. "--sweep_batches=32 --sweep_modes=compact --sweep_shapes_only").
#   OUT=/tmp/gpu bash tests/run_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
STAGES=${M2V_STAGES:-decode gpu_tests bench batch prefill sweep chunk_sweep suite}
status=0
stage() {  # stage NAME DEFAULT_LIMIT_S COMMAND...
  local name=$1 var="M2V_LIMIT_${1^^}"; local limit=${!var:-$2}; shift 2
  echo "=== $name (limit ${limit}s) ==="
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc ==="
  [ "$rc" = 0 ] || status=1
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  git log -1 --format='commit %H %s' 2>/dev/null; } 2>&1 | tee "$OUT/device.txt"
for s in $STAGES; do
  case $s in
    gpu_tests) stage gpu_tests 300 $PY -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
                 ${M2V_GPU_TESTS_K:+-k "$M2V_GPU_TESTS_K"} ;;
    bench) stage bench 200 $PY -m m2v_jax.bench --suites=main,breakdown --out="$OUT/bench.json" ;;
    batch) stage batch 150 $PY -m m2v_jax.bench --suites=batch --out="$OUT/batch.json" ;;
    prefill) stage prefill 150 $PY -m m2v_jax.bench --suites=prefill --out="$OUT/prefill.json" ;;
    decode) stage decode 90 $PY examples/decode.py --replay_mode=compact --max_new_tokens=400 \
              --abba_prompts=3 ;;
    sweep) stage sweep 150 $PY -m m2v_jax.bench --suites=sweep --out="$OUT/sweep.json" \
             ${M2V_SWEEP_ARGS:-} ;;
    chunk_sweep) stage chunk_sweep 120 $PY -m m2v_jax.bench --suites=chunk_sweep \
                   --out="$OUT/chunk_sweep.json" ;;
    suite) stage suite_tests 600 $PY -m pytest -q -x tests -m "not gpu" -p no:cacheprovider ;;
  esac
done
exit $status

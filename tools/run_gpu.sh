#!/usr/bin/env bash
# Every GPU check and benchmark, in one run (one device call). Run from the repository root
# on a machine with a CUDA GPU and JAX 0.11.2 (the package need not be installed: the root
# goes on PYTHONPATH). Results go to $OUT (default ./gpu_out): device.txt, one log per
# stage, and one JSON per benchmark suite.
#
#   OUT=/tmp/gpu bash tools/run_gpu.sh
#   M2V_STAGES="gpu_tests loop" OUT=/tmp/gpu bash tools/run_gpu.sh
#
# Stages (M2V_STAGES; default: gpu_tests main batch loop prefill breakdown decode sanitizer):
#   gpu_tests    pytest -m gpu: the compiled variant of every kernel test class and the GPU-only
#                checks (Bolt geometry, rounding canary, in-place updates, 2-GPU sharding)
#   main batch loop flush prefill ragged breakdown sweep chunk_sweep tree
#                benchmarks/bench.py suites of those names (-> NAME.json)
#   precision    tools/prefill_precision_error.py: the chunked prefill's error at each product
#                precision against a float64 oracle (-> prefill_precision.json)
#   memory       tools/prefill_memory.py: XLA's temporary bytes of compiled chunked prefills,
#                with and without the scratch limit (-> prefill_memory.json)
#   model        benchmarks/model_bench.py: 8 Bolt layers with projections, greedy vs
#                speculative in both modes, tokens/s (-> model.json; M2V_MODEL_ARGS adds flags)
#   decode       the example decoder in both modes, timed
#   sanitizer    compute-sanitizer (memcheck, initcheck, synccheck, racecheck) over
#                tools/sanitize_calls.py (-> sanitizer_TOOL.log) at M2V_SANITIZER_GEOMETRY
#                (default small: 8 heads of Bolt's head shape, the same tiles)
#   ncu          ncu --clock-control none, a short metric list, on the conv and SSM kernels of
#                tools/profile_call.py (M2V_NCU_MODES, default compact and snapshot; B=32, R=8,
#                mixed rows; M2V_PROFILE_ARGS adds flags, e.g. --window=32); it skips
#                M2V_NCU_SKIP launches, then profiles M2V_NCU_COUNT (default 2 and 2: skips
#                the warm-up call's two launches, profiles the timed call's two)
#   ncu_chunk    the same metrics on the chunked prefill's kernels (B=1, R=4096, bf16)
# M2V_LIMIT_<STAGE> caps a stage's seconds; M2V_GPU_TESTS_K filters the GPU tests (pytest -k);
# M2V_BENCH_ARGS adds flags to every benchmark stage; M2V_TEST_WORKERS sets pytest workers;
# M2V_TEST_TIMEOUT: pytest-timeout's limit per GPU test (seconds, default 240).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
STAGES=${M2V_STAGES:-gpu_tests main batch loop prefill breakdown decode sanitizer}
NCU_METRICS=gpu__time_duration.sum,sm__inst_executed.sum,\
smsp__issue_active.avg.pct_of_peak_sustained_active,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,\
launch__occupancy_limit_registers,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
status=0
stage() {  # stage NAME DEFAULT_LIMIT_S COMMAND...
  local name=$1 var="M2V_LIMIT_${1^^}"; local limit=${!var:-$2}; shift 2
  echo "=== $name (limit ${limit}s) $(date -u +%T) ==="
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc $(date -u +%T) ==="
  [ "$rc" = 0 ] || status=1
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  git log -1 --format='commit %H %s' 2>/dev/null
  # The code that ran (the device's git metadata may predate the working tree it got): compare
  # with `LC_ALL=C; cat m2v_jax/*.py m2v_jax/kernels/*.py | sha1sum` at a commit (the C
  # locale's file order; the device's own locale sorts the globs otherwise).
  echo "m2v_jax sources sha1 $(export LC_ALL=C; cat m2v_jax/*.py m2v_jax/kernels/*.py \
    | sha1sum | cut -c1-40)"
} 2>&1 | tee "$OUT/device.txt"
for s in $STAGES; do
  case $s in
    gpu_tests) XLA_PYTHON_CLIENT_PREALLOCATE=false stage gpu_tests 560 \
                 $PY -m pytest --durations=15 -m gpu tests -p no:cacheprovider -p no:benchmark \
                 -n "${M2V_TEST_WORKERS:-12}" --timeout="${M2V_TEST_TIMEOUT:-240}" --timeout-method=thread \
                 ${M2V_GPU_TESTS_K:+-k "$M2V_GPU_TESTS_K"} ;;
    main|batch|loop|flush|prefill|ragged|breakdown|sweep|chunk_sweep|tree)
      stage "$s" 200 $PY benchmarks/bench.py --suites="$s" --out="$OUT/$s.json" ${M2V_BENCH_ARGS:-} ;;
    precision) stage precision 200 $PY tools/prefill_precision_error.py \
                 --out="$OUT/prefill_precision.json" ;;
    memory) stage memory 200 $PY tools/prefill_memory.py --out="$OUT/prefill_memory.json" ;;
    model) stage model 300 $PY benchmarks/model_bench.py --out="$OUT/model.json" ${M2V_MODEL_ARGS:-} ;;
    decode) stage decode 120 $PY examples/decode.py --replay_mode=compact --max_new_tokens=400 \
              --repeats=5 ;;
    sanitizer) (  # a subshell: its settings end with the stage
      # One plain run fills a compilation cache, so the tools' runs compile nothing. One device
      # allocation per buffer (no preallocated pool for the tools to track); no XLA command
      # buffers: with the kernels inside CUDA graphs initcheck reports reads that it does not
      # report for the same launches one by one (tests/gpu_logs/README.md).
      own_cache=${JAX_COMPILATION_CACHE_DIR:+no}
      export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_command_buffer="
      export XLA_PYTHON_CLIENT_ALLOCATOR=platform JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/m2v_jax_cache} \
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
      san=(tools/sanitize_calls.py --geometry="${M2V_SANITIZER_GEOMETRY:-small}")
      stage sanitizer_warm 120 $PY "${san[@]}"
      for tool in ${M2V_SANITIZER_TOOLS:-memcheck synccheck initcheck racecheck}; do
        # Every kernel is checked, XLA's too: with a --kernel-name filter, initcheck does not
        # see the stores of the kernels it skips and reports their outputs as uninitialized.
        # timeout signals its whole process group: the sanitizer and the Python it runs.
        stage "sanitizer_$tool" 150 compute-sanitizer --tool "$tool" --print-limit 20 \
          $PY "${san[@]}"
      done
      [ -n "$own_cache" ] || rm -rf "$JAX_COMPILATION_CACHE_DIR"
      exit $status ) || status=1 ;;
    ncu)  # a short metric list at B=32: full sections replay each kernel with its memory saved
      for mode in ${M2V_NCU_MODES:-compact snapshot}; do  # no preallocated pool to back up
        XLA_PYTHON_CLIENT_PREALLOCATE=false stage "ncu_$mode" 150 ncu --clock-control none --kernel-name regex:'m2v_(conv|ssm)' \
          --launch-skip ${M2V_NCU_SKIP:-2} --launch-count ${M2V_NCU_COUNT:-2} --metrics "$NCU_METRICS" \
          $PY tools/profile_call.py --mode="$mode" --batch=32 --calls=1 ${M2V_PROFILE_ARGS:-}
      done ;;
    ncu_chunk)  # the chunked prefill's 9 launches at R=4096 (bf16): per segment (two) conv,
      # fused chunk states and passing, C·Bᵀ, output; then the tails' y rows
      XLA_PYTHON_CLIENT_PREALLOCATE=false stage ncu_chunk 150 ncu --clock-control none --kernel-name regex:m2v_chunk \
        --launch-skip 9 --launch-count 9 --metrics "$NCU_METRICS" \
        $PY tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1 \
        ${M2V_PROFILE_ARGS:-} ;;
    *) echo "unknown stage $s"; status=1 ;;
  esac
done
exit $status

#!/bin/bash
# For a later session (prepared in sessions 27-28, not yet run): the scratch limit
# (`ChunkTiles.scratch_mb`, 100 MB a sequence), its segments' layout, and "highest" products
# that keep 16-bit post-conv rows whole. Three device calls of ~6 minutes each, from the
# repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session28_segments.sh scratch
#   OUT=/tmp/out bash benchmarks/results/commands_next/session28_segments.sh b2
#   OUT=/tmp/out bash benchmarks/results/commands_next/session28_segments.sh highest
# scratch: 1. XLA's temporary bytes and compile seconds of prefills, the limit on and off
#   (compile only; R=32768 too, 19 segments);
#   2. chunk_sweep at R=4096, the table (bf16: two segments; float32: nine) against the same
#   tiles with scratch_mb=0 (one scan), interleaved, both checked against the serial kernel;
#   3. prefill (chunked, R=37/512/4096).
# b2: two padded prompts of 4096 rows (bf16), the table (two segments) against one scan, and
#   against session 27's layout (the bodies back to back cut into even runs, so the pass
#   kernel runs the two prompts' chains in turn: a copy of the package with
#   segments_sequence_major.patch, which changes only slot_table's partition), in turn twice.
# highest: 4. ragged (8 packed prompts: one segment; one prompt of 13,700 rows: seven; the
#   4000- and 3100-row prompts one by one: two each); 5. "highest" with bfloat16 activations:
#   chunk_sweep at R=4096, the table (64-row chunks, two kernels, eight segments) against one
#   scan, 128-row chunks and the fused pass at 64 and 128 rows; 6. "highest" before and after
#   its products change, in turn twice (a copy of the package with highest_three_passes.patch:
#   three TF32 passes of every product, as before).
# A fourth call, to run first (commands_next/README.md), runs the compiled tests of the
# changed code and the precision table:
#   M2V_STAGES="gpu_tests precision" \
#     M2V_GPU_TESTS_K="prefill or packed or chunk or highest or segment" \
#     M2V_LIMIT_GPU_TESTS=400 OUT=/tmp/out bash tools/run_gpu.sh
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_next
bench() {  # bench SECONDS NAME ARGS...: one bench.py run, its table rows kept
  local s=$1 n=$2; shift 2
  echo "=== $n $(date -u +%T)"
  timeout -k 5 $s python3 benchmarks/bench.py "$@" --out=$O/$n.json 2>&1 \
    | grep -E "^\||Error|error" | tee $O/$n.txt
}
bf16_stages() {  # bf16_stages SECONDS: XLA's bytes, one scan against segments, the prefill suite
  echo "=== memory $(date -u +%T)"
  timeout -k 5 150 python3 tools/prefill_memory.py --dtypes=bfloat16 \
    --out=$O/memory_bf16.json 2>&1 | grep -E "^\{|Error" | tee $O/memory_bf16.txt
  # The table's entry with scratch_mb=0 (one scan).
  bench 150 segments_sweep_bf16 --suites=chunk_sweep \
    --chunk_variants=128:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1:0
  bench $1 prefill --suites=prefill --prefill_cases=chunked --lengths=37,512,4096
}
case ${1:-} in
  scratch)
    bf16_stages 120
    timeout -k 5 90 python3 tools/prefill_memory.py --dtypes=float32 --lengths=4096 --packed= \
      --out=$O/memory_f32.json 2>&1 | grep -E "^\{|Error" | tee $O/memory_f32.txt
    # 19 segments: the compile time as launches grow with the rows.
    timeout -k 5 120 python3 tools/prefill_memory.py --dtypes=bfloat16 --lengths=32768 \
      --packed= --out=$O/memory_32k.json 2>&1 | grep -E "^\{|Error" | tee $O/memory_32k.txt
    bench 150 segments_sweep_f32 --suites=chunk_sweep --dtype=float32 \
      --chunk_variants=64:16:4:1:64:4:16:2:4:1:1:32:256:4:64:0:0 ;;
  short)  # scratch's bf16 stages only, for a call with ~400 s of device time left
    bf16_stages 90 ;;
  b2)
    B0=/tmp/m2v_sequence_major; rm -rf $B0; mkdir -p $B0 && cp -r m2v_jax $B0/ \
      && (cd $B0 && patch -s -p1 < $OLDPWD/$D/segments_sequence_major.patch)
    for i in 1 2; do
      for v in parts whole; do
        P=$PWD; [ $v = whole ] && P=$B0:$PWD
        PYTHONPATH=$P bench 150 b2_${v}_$i --suites=chunk_sweep --chunk_batch=2 \
          --chunk_variants=128:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1:0
      done
    done ;;
  highest)
    bench 150 ragged --suites=ragged
    bench 200 highest_sweep --suites=chunk_sweep --prefill_precision=highest \
      --chunk_variants=64:16:4:1:64:4:16:2:4:1:1:32:256:4:64:0:0,128:16:4:1:64:4:16:2:4:1:1:32:256:4:64:0,64:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1,128:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1
    B0=/tmp/m2v_before_products; rm -rf $B0; mkdir -p $B0 && cp -r m2v_jax $B0/ \
      && (cd $B0 && patch -s -p1 < $OLDPWD/$D/highest_three_passes.patch)
    for i in 1 2; do
      for v in after before; do
        P=$PWD; [ $v = before ] && P=$B0:$PWD
        PYTHONPATH=$P bench 100 highest_${v}_$i --suites=prefill --prefill_cases=chunked \
          --prefill_precision=highest --lengths=512,4096
      done
    done ;;
  *) echo "usage: $0 scratch|short|b2|highest"; exit 2 ;;
esac
echo "=== done $(date -u +%T)"

#!/bin/bash
# Session 45's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session45.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session45/README.md.
#   c5: the working tree holds `cb_acum.patch` (the C·Bᵀ kernel sums each slot's cumulative
#       dt·A; the fused pass and the output kernel load it; XLA's cumsum gone). The prefill
#       suite's chunked case (B=1 bf16, R=512 and 4096): new, HEAD, HEAD with
#       `pass_acum.patch`, new, HEAD; then new's timelines at R=512 and 4096 and the compiled
#       prefill, packed, chunk and segment tests.
#   c7: `seq_table.patch` applied (one per-sequence int32 table a segment instead of XLA's
#       small arrays; rows filled in the output kernel; its tests and docs too). The prefill
#       suite's chunked case (B=1 bf16, R=512 and 4096): new, HEAD, new, HEAD; new's
#       timeline at R=512; the compiled packed, padding and rejection tests (C7_TEST_S, 100
#       s); the patch stays applied.
#   c6: chunk_sweep B=1 bf16 at R=4096 and 512 on the working tree: the table, then the
#       fused pass in P tiles of 32, with 2 stages, both, and the output kernel in 64-row
#       programs of 4 warps (C6_VARIANTS, ChunkTiles texts joined by commas, overrides them).
D=$(dirname "$0")
. $D/lib.sh   # ser, timeline
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  c5)
    S=/tmp/s45_c5; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c5.tgz -C /tmp s45_c5' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      N=$D/cb_acum.patch
      ser $S new
      patch -p1 -R < $N > /dev/null || exit 1
      ser $S old
      patch -p1 < $D/pass_acum.patch > /dev/null || exit 1
      ser $S pass_acum
      patch -p1 -R < $D/pass_acum.patch > /dev/null || exit 1
      patch -p1 < $N > /dev/null || exit 1
      ser $S new2
      patch -p1 -R < $N > /dev/null || exit 1
      ser $S old2
      patch -p1 < $N > /dev/null || exit 1
      for R in 512 4096; do timeline $S $R; done
      M2V_STAGES=gpu_tests M2V_GPU_TESTS_K="prefill or packed or chunk or segment" \
        M2V_LIMIT_GPU_TESTS=300 OUT=$S bash tools/run_gpu.sh > $S/run.txt 2>&1
      tail -3 $S/gpu_tests.log )
    ;;
  c7)
    S=/tmp/s45_c7; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c7.tgz -C /tmp s45_c7' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      N=$D/seq_table.patch
      patch -p1 < $N > /dev/null || exit 1
      ser $S new
      patch -p1 -R < $N > /dev/null || exit 1
      ser $S old
      patch -p1 < $N > /dev/null || exit 1
      ser $S new2
      patch -p1 -R < $N > /dev/null || exit 1
      ser $S old2
      patch -p1 < $N > /dev/null || exit 1
      timeline $S 512
      M2V_STAGES=gpu_tests M2V_GPU_TESTS_K="packed or padding or reject or fills" \
        M2V_LIMIT_GPU_TESTS=${C7_TEST_S:-100} OUT=$S bash tools/run_gpu.sh > $S/run.txt 2>&1
      tail -3 $S/gpu_tests.log )
    ;;
  c6)
    S=/tmp/s45_c6; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c6.tgz -C /tmp s45_c6' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      TB=chunk=128:block_p=64:state_heads=16:state_stages=3:fused_pass=1:out_rows=128:out_cols=32:out_acum=1:out_stages=3:out_warps=8
      v() { echo $TB | sed "$1"; }   # the table's fields with one sed edit
      VS=${C6_VARIANTS:-$(v s/block_p=64/block_p=32/),$(v s/state_stages=3/state_stages=2/),$(v "s/block_p=64/block_p=32/; s/state_stages=3/state_stages=2/"),$(v "s/out_rows=128/out_rows=64/; s/out_warps=8/out_warps=4/")}
      for R in 4096 512; do
        sweep $S vars_r$R $R "$VS"
      done )
    ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

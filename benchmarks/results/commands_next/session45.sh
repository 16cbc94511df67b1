#!/bin/bash
# Session 45's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session45.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session45/README.md.
#   c5: the working tree holds `cb_acum.patch` (the C·Bᵀ kernel sums each slot's cumulative
#       dt·A; the fused pass and the output kernel load it; XLA's cumsum gone). The prefill
#       suite's chunked case (B=1 bf16, R=512 and 4096): new, HEAD, new, HEAD (as it ran:
#       new, HEAD, HEAD with `pass_acum.patch`, new, HEAD); then new's timelines at R=512 and
#       4096 and the compiled prefill, packed, chunk and segment tests.
#   c7: `seq_table.patch` applied (one per-sequence int32 table a segment instead of XLA's
#       small arrays; rows filled in the output kernel; its tests and docs too). The prefill
#       suite's chunked case (B=1 bf16, R=512 and 4096): new, HEAD, new, HEAD; new's
#       timeline at R=512; the compiled packed, padding, rejection and tiles tests (C7_TEST_S, 100
#       s); the patch stays applied.
#   c8: `cst_last.patch` (the output kernel's loaded path adds exp(acum) C stᵀ after the
#       causal loop instead of starting from it): the prefill suite's chunked case, new,
#       HEAD, new, HEAD; then ncu of the first output launch at R=512 and 2048 with it.
#   c6: chunk_sweep B=1 bf16 at R=4096 and 512 on the working tree: the table, then the
#       fused pass in P tiles of 32, with 2 stages, both, and the output kernel in 64-row
#       programs of 4 warps (C6_VARIANTS, ChunkTiles texts joined by commas, overrides them).
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, ab, gpu_tests
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  c5)
    S=/tmp/s45_c5; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c5.tgz -C /tmp s45_c5' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      patch -p1 -R < $D/cb_acum.patch > /dev/null || exit 1   # the tree held it
      ab $S $D/cb_acum.patch || exit 1      # (run as: new, HEAD, pass_acum, new, HEAD)
      for R in 512 4096; do timeline $S $R; done
      gpu_tests $S "prefill or packed or chunk or segment" 300 )
    ;;
  c7)
    S=/tmp/s45_c7; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c7.tgz -C /tmp s45_c7' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ab $S $D/seq_table.patch || exit 1
      timeline $S 512
      gpu_tests $S "packed or padding or reject or fills or tiles_match" ${C7_TEST_S:-100} )
    ;;
  c8)
    S=/tmp/s45_c8; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c8.tgz -C /tmp s45_c8' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ab $S $D/cst_last.patch || exit 1
      for R in 512 2048; do NCU_ROWS=$R ncu_out $S cst_last_r$R; done
      patch -p1 -R < $D/cst_last.patch > /dev/null )
    ;;
  c6)
    S=/tmp/s45_c6; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/c6.tgz -C /tmp s45_c6' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      v() { echo $TB | sed "$1"; }   # the table's fields with one sed edit
      VS=${C6_VARIANTS:-$(v s/block_p=64/block_p=32/),$(v s/state_stages=3/state_stages=2/),$(v "s/block_p=64/block_p=32/; s/state_stages=3/state_stages=2/"),$(v "s/out_rows=128/out_rows=64/; s/out_warps=8/out_warps=4/")}
      for R in 4096 512; do
        sweep $S vars_r$R $R "$VS"
      done )
    ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

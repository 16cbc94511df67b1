#!/bin/bash
# Session 57's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session57.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session57/README.md.
# x1 and n1 apply `fused_xconv.patch` (x's conv in the fused kernel, `ChunkTiles.fused_xconv`;
# applies to b122bff and after) and reverse it at the end.
#   x1: x's conv in the fused kernel (`ChunkTiles.fused_xconv=1`; the body conv then forms
#       only B, C and dt): chunk_sweep against the table's entry, bf16 B=1 at R=4096 and
#       512 (in 4 warps, as the table, and in 8; the table's in 8 for reference), B=8
#       R=1712 (about the packed suite's rows), and "highest" B=1 R=4096 (P tiles of 32).
#   n1: ncu at B=1 bf16 R=512 of the fused kernel and of the body conv, the table's entry
#       and with fused_xconv=1 (4 warps): instructions, issue, stalls, local loads, L1 hits
#       (N1_CONV=0: the fused kernel only).
#   c64: (not yet run) `conv_body64.patch` (the conv programs load a body of up to 64 rows
#       at once, the dt program keeps its loop past 32: session 56's `conv_body_loads.patch`
#       without the dt part) against the library's code, old / new twice, B=1 bf16 serial
#       prefill at R=41, 56 and 72; then ncu of R=72's conv launch with it, the busiest
#       SM's active cycles against the average.
D=$(dirname "$0")
. $D/lib.sh
XB=chunk=64:block_p=64:state_heads=16:fused_pass=1:fused_y=1:out_rows=64:out_cols=64
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s57_$s; rm -rf $S; mkdir -p $S
  case $s in
  x1)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/x1.tgz -C /tmp s57_x1" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/fused_xconv.patch || exit 1
      T=${X1_S:-110} sweep $S bf16_4096 4096 $XB:fused_xconv=1,$XB:state_warps=8:fused_xconv=1,$XB:state_warps=8
      T=${X1_S:-110} sweep $S bf16_512 512 $XB:fused_xconv=1,$XB:state_warps=8:fused_xconv=1
      BATCH=8 T=${X1_S:-110} sweep $S bf16_b8_1712 1712 $XB:fused_xconv=1,$XB:state_warps=8:fused_xconv=1
      PREC=--prefill_precision=highest T=${X1_S:-110} sweep $S highest_4096 4096 \
        ${XB/block_p=64/block_p=32}:fused_xconv=1 )
    ;;
  n1)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/n1.tgz -C /tmp s57_n1" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/fused_xconv.patch || exit 1
      M=,smsp__sass_inst_executed_op_local_ld.sum,l1tex__t_sector_hit_rate.pct,sm__cycles_active.avg
      for v in 0 1; do
        NCU_S=70 NCU_MORE=$M PROFILE_ARGS=--chunk_tiles=$XB:fused_xconv=$v \
          ncu_k $S fused_x$v m2v_chunk_fused 512
        [ "${N1_CONV:-1}" = 1 ] || continue
        NCU_S=70 NCU_MORE=$M PROFILE_ARGS=--chunk_tiles=$XB:fused_xconv=$v \
          ncu_k $S conv_x$v m2v_chunk_conv 512
      done )
    ;;
  c64)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/c64.tgz -C /tmp s57_c64" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      for k in 1 2; do
        serg old$k 41,56,72
        on $D/conv_body64.patch || exit 1
        serg new$k 41,56,72
        undo
      done
      on $D/conv_body64.patch || exit 1
      NCU_MORE=,sm__cycles_active.max,sm__cycles_active.avg PROFILE_ARGS=--nochunked \
        ncu_k $S conv72_new m2v_conv 72 )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

#!/bin/bash
# Session 48's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session48.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session48/README.md.
#   f1: the whole scan in one kernel (`ChunkTiles.fused_y`, the table's): chunk_sweep B=1
#       bf16 at R=512 and 4096, the table against the previous table (OLD) and variants of
#       the fused kernel's stages (3, 1) and blocks (64 columns, 64 rows; at one stage:
#       more do not fit in shared memory); the prefill suite's chunked case; ncu of the
#       fused kernel at R=512 and 4096.
#   f3: the table at one stage (call 2's best) against OLD at B=8, R=512; issue 22's
#       figures (`session44.sh goal`: R=37, 512, 4096, ragged); with F3_MORE set, B=1 at
#       R=512 against OLD and P tiles of 32 (twice the programs; 8 warps: 239 registers
#       offline, no spills) and ncu of the fused kernel.
#   x2: `fused_exp2.patch` (the fused kernel's weights as one ex2.approx of a_t - b_s,
#       log2(dt) folded into b): the prefill suite's chunked case with it, then B=8 at
#       R=512 (the table with it against OLD), the prefill suite without it, and the
#       compiled prefill tests with it (X2_TEST_S seconds, default 80). Leaves the tree as
#       it found it.
#   x3: x2's first and third parts only (the prefill suite with and without the patch).
#   t1: the compiled tests of the prefill paths (T1_TEST_S seconds, default 150).
#   f2: the compiled tests of the prefill paths (F2_TEST_S seconds), the timelines at R=512
#       and 4096, and issue 22's figures (`session44.sh goal`'s runs).
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, gpu_tests, on, off, undo, ncu_k
OLD=$TB                                                   # the table before fused_y
NEW=$(echo $TB | sed 's/state_stages=3/state_stages=2/; s/out_cols=32/out_cols=128/'):state_warps=8:fused_y=1  # the table's
S1=${NEW/state_stages=2/state_stages=1}
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  f1)
    S=/tmp/s48_f1; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/f1.tgz -C /tmp s48_f1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      T=170 sweep $S r512 512 "$OLD,${NEW/state_stages=2/state_stages=3},$S1,${S1/out_cols=128/out_cols=64},$(echo $S1 | sed 's/out_rows=128/out_rows=64/; s/out_cols=128/out_cols=64/')"
      T=200 sweep $S r4096 4096 "$OLD,${NEW/state_stages=2/state_stages=3},$S1"
      ncu_k $S fused_r512 m2v_chunk_fused 512
      ser $S ser
      ncu_k $S fused_r4096 m2v_chunk_fused 4096 )
    ;;
  f3)
    S=/tmp/s48_f3; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/f3.tgz -C /tmp s48_f3' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      N1=${NEW/state_stages=2/state_stages=1}            # the table's since call 2
      BATCH=8 T=150 sweep $S b8_r512 512 "$OLD"
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -24 $S/goal.txt
      [ -n "$F3_MORE" ] || exit 0
      T=150 sweep $S r512 512 "$OLD,$(echo $N1 | sed 's/block_p=64/block_p=32/; s/out_cols=128/out_cols=32/')"
      ncu_k $S fused_r512 m2v_chunk_fused 512 )
    ;;
  x2|x3)
    S=/tmp/s48_$s; rm -rf $S; mkdir -p $S
    ( trap "undo; tar czf ${OUT:-/tmp/out}/$s.tgz -C /tmp s48_$s" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      on $D/fused_exp2.patch || exit 1
      ser $S new
      [ $s = x3 ] || BATCH=8 T=120 sweep $S b8_r512 512 "$OLD"
      off $D/fused_exp2.patch || exit 1
      ser $S old
      [ $s = x3 ] && exit 0
      on $D/fused_exp2.patch || exit 1
      gpu_tests $S "prefill and (chunk or packed or segment or tiles)" ${X2_TEST_S:-80} )
    ;;
  t1)
    S=/tmp/s48_t1; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/t1.tgz -C /tmp s48_t1' EXIT
      gpu_tests $S "prefill or packed or ragged or segment" ${T1_TEST_S:-150} )
    ;;
  f2)
    S=/tmp/s48_f2; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/f2.tgz -C /tmp s48_f2' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      gpu_tests $S "prefill or packed or ragged or segment" ${F2_TEST_S:-200}
      timeline $S 512
      timeline $S 4096
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -20 $S/goal.txt )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

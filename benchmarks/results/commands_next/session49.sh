#!/bin/bash
# Session 49's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session49.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session49/README.md.
# Stages x, a and b apply patches to the code they ran on (x: 8bdd546, a and b: cc08fe8);
# since session 49's commits only g and h run on HEAD.
#   x: `fused_exp2.patch` (the fused kernel's weights as one ex2.approx of a_t - b_s):
#      the prefill suite's chunked case (B=1 bf16, R=512 and 4096) with, without, with,
#      without; then, with it, chunk_sweep B=1 R=512 of the table, chunk=256 and the entry
#      before fused_y (OLD), B=8 R=512 against OLD, and the compiled prefill tests
#      (X_TEST_S seconds, default 100). Leaves the tree as it found it.
#   a: `fused_ahead.patch` (the fused kernel loads C beside B at a step's start and the
#      slot's row and length a step ahead) on HEAD (the exp2 weights landed): the prefill
#      suite's chunked case with, without, with, without; ncu of the fused kernel at R=512
#      with it; the compiled prefill tests with it (A_TEST_S seconds, default 150).
#   b: `seq_table2.patch` (one int32 table a segment for every kernel's per-sequence values
#      instead of five small XLA arrays; `seq_table.patch` ported to fused_y) and
#      `fused_ahead_seq.patch` (`fused_ahead.patch` on top of it) and `dt_fold.patch` (on top
#      of both: the fused kernel processes the raw dt, no XLA op for it): the prefill
#      suite's chunked case, in the order seq, +ahead, +dt, HEAD, twice; then with all
#      three: ncu of the fused kernel at R=512, the timeline at R=512 and the compiled
#      prefill tests (B_TEST_S seconds, default 150).
#   h: `g`, then the timeline at R=4096 and chunk_sweep B=1 of conv_rows=16 and of the
#      fused kernel at 2 stages (Triton then loads B and C ahead by cp.async) against the
#      table at R=512 and 4096 (conv_rows=16: 0.988 and 0.998 in session 46, 0.98 at R=512
#      in session 49).
#   g: issue 22's figures (`session44.sh goal`: R=37, 512, 4096, ragged) on HEAD, and the
#      timeline at R=512.
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, gpu_tests, on, off, undo, ncu_k
OLD=$TB
S1=$(echo $TB | sed 's/state_stages=3/state_stages=1/; s/out_cols=32/out_cols=128/'):state_warps=8:fused_y=1  # the table's
X=$D/fused_exp2.patch
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  x)
    S=/tmp/s49_x; rm -rf $S; mkdir -p $S
    ( trap "undo; tar czf ${OUT:-/tmp/out}/x.tgz -C /tmp s49_x" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      on $X || exit 1; ser $S new;  off $X || exit 1; ser $S old
      on $X || exit 1; ser $S new2; off $X || exit 1; ser $S old2
      on $X || exit 1
      T=170 sweep $S r512 512 "${S1/chunk=128/chunk=256},$OLD"
      BATCH=8 T=120 sweep $S b8_r512 512 "$OLD"
      gpu_tests $S "prefill and (chunk or packed or segment or tiles)" ${X_TEST_S:-100} )
    ;;
  a)
    S=/tmp/s49_a; rm -rf $S; mkdir -p $S
    ( trap "undo; tar czf ${OUT:-/tmp/out}/a.tgz -C /tmp s49_a" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      A=$D/fused_ahead.patch
      on $A || exit 1; ser $S new;  off $A || exit 1; ser $S old
      on $A || exit 1; ser $S new2; off $A || exit 1; ser $S old2
      on $A || exit 1
      ncu_k $S fused_r512 m2v_chunk_fused 512
      gpu_tests $S "prefill or packed or ragged or segment" ${A_TEST_S:-150} )
    ;;
  b)
    S=/tmp/s49_b; rm -rf $S; mkdir -p $S
    ( trap "undo; tar czf ${OUT:-/tmp/out}/b.tgz -C /tmp s49_b" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      Q=$D/seq_table2.patch; A=$D/fused_ahead_seq.patch; F=$D/dt_fold.patch
      for k in 1 2; do
        on $Q || exit 1; ser $S seq$k; on $A || exit 1; ser $S both$k
        on $F || exit 1; ser $S dt$k
        off $F || exit 1; off $A || exit 1; off $Q || exit 1; ser $S head$k
      done
      on $Q || exit 1; on $A || exit 1; on $F || exit 1
      ncu_k $S fused_r512 m2v_chunk_fused 512
      timeline $S 512
      gpu_tests $S "prefill or packed or ragged or segment" ${B_TEST_S:-150} )
    ;;
  h)
    S=/tmp/s49_h; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/h.tgz -C /tmp s49_h' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -24 $S/goal.txt
      timeline $S 512
      timeline $S 4096
      T=150 sweep $S r512 512 "$S1:conv_rows=16,${S1/state_stages=1/state_stages=2}"
      T=200 sweep $S r4096 4096 "$S1:conv_rows=16,${S1/state_stages=1/state_stages=2}" )
    ;;
  g)
    S=/tmp/s49_g; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/g.tgz -C /tmp s49_g' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -24 $S/goal.txt
      timeline $S 512 )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

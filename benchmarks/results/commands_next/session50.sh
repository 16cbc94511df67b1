#!/bin/bash
# Session 50's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session50.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session50/README.md.
# Stages l and d reverse the patches they measure, which were in the tree when they ran;
# both are in HEAD since c557be4: on HEAD `d` runs as is, `l` needs dt_conv.patch reversed
# first.
#   t: timelines (kernels and XLA's HLO) of the B=1 bf16 snapshot prefill at R=37, 512, 4096.
#   s: chunk_sweep B=1 of conv_rows=16 and of the fused kernel at 2 stages against the table,
#      R=512 and 4096.
#   l: `tail_lead.patch` (in the tree when the stage starts: the verify tail's conv takes the
#      window after each body as an input instead of a scatter into the pool, and the body
#      conv reads the starting conv state from the pool): the prefill suite's chunked case
#      with, without, with, without; the timeline at R=512 with it; the compiled prefill
#      tests (L_TEST_S seconds, default 200).
#   d: `dt_conv.patch` on top of `tail_lead.patch`, both in the tree when the stage starts
#      (the body conv also processes its rows' dt, in a last column of programs, instead of
#      an XLA op over all slots; in snapshot mode the tail takes every sequence's window
#      with no flag): the prefill suite's chunked case with both (all), with tail_lead only
#      (lead), with neither (head), twice; the timelines at R=512 and 4096 with both; the
#      compiled tests of the prefill paths and the verify conv (D_TEST_S, default 220).
#   g: issue 22's figures (`session44.sh goal`).
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, gpu_tests, on, off, undo, ncu_k
S1=$(echo $TB | sed 's/state_stages=3/state_stages=1/; s/out_cols=32/out_cols=128/'):state_warps=8:fused_y=1  # the table's
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s50_$s; rm -rf $S; mkdir -p $S
  case $s in
  t)
    ( trap "tar czf ${OUT:-/tmp/out}/t.tgz -C /tmp s50_t" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for R in 37 512 4096; do timeline $S $R; done )
    ;;
  s)
    ( trap "tar czf ${OUT:-/tmp/out}/s.tgz -C /tmp s50_s" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      T=130 sweep $S r512 512 "$S1:conv_rows=16,${S1/state_stages=1/state_stages=2}"
      T=170 sweep $S r4096 4096 "$S1:conv_rows=16,${S1/state_stages=1/state_stages=2}" )
    ;;
  l)
    ( L=$D/tail_lead.patch
      trap "tar czf ${OUT:-/tmp/out}/l.tgz -C /tmp s50_l" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ser $S new; patch -p1 -R < $L > /dev/null || exit 1; ser $S old
      patch -p1 < $L > /dev/null || exit 1; ser $S new2
      patch -p1 -R < $L > /dev/null || exit 1; ser $S old2
      patch -p1 < $L > /dev/null || exit 1
      timeline $S 512
      gpu_tests $S "prefill or packed or ragged or segment" ${L_TEST_S:-200} )
    ;;
  d)
    ( L=$D/tail_lead.patch; DT=$D/dt_conv.patch
      trap "tar czf ${OUT:-/tmp/out}/d.tgz -C /tmp s50_d" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for k in 1 2; do
        ser $S all$k; patch -p1 -R < $DT > /dev/null || exit 1; ser $S lead$k
        patch -p1 -R < $L > /dev/null || exit 1; ser $S head$k
        patch -p1 < $L > /dev/null || exit 1; patch -p1 < $DT > /dev/null || exit 1
      done
      timeline $S 512
      timeline $S 4096
      gpu_tests $S "prefill or packed or ragged or segment or conv" ${D_TEST_S:-220} )
    ;;
  g)
    ( trap "tar czf ${OUT:-/tmp/out}/g.tgz -C /tmp s50_g" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -24 $S/goal.txt )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

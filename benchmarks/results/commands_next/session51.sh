#!/bin/bash
# Session 51's calls, from the repository root on HEAD (the patches applied here):
#   OUT=/tmp/out bash benchmarks/results/commands_next/session51.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session51/README.md.
#   a: `lead_in_kernel.patch` (the tail's conv launch builds the window after each body from
#      the flat rows) and `head_masked.patch` on top (the body conv loads the pool's window
#      only in blocks that open a body): the prefill suite's chunked case on HEAD, with
#      lead_in, with both, twice; the timeline at R=512 with both; ncu of the body conv at
#      R=4096 on HEAD and with head_masked.
#   c: the compiled tests of the prefill paths and the verify conv with the patches named in
#      PATCHES (C_TEST_S seconds, default 240).
D=$(dirname "$0")
. $D/lib.sh   # ser, timeline, ncu_k, gpu_tests, on, off, undo
LI=$D/lead_in_kernel.patch; HM=$D/head_masked.patch
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s51_$s; rm -rf $S; mkdir -p $S
  case $s in
  a)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/a.tgz -C /tmp s51_a" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ncu_k $S conv_head m2v_chunk_conv 4096
      for k in 1 2; do
        ser $S head$k; on $LI || exit 1; ser $S lead$k; on $HM || exit 1; ser $S both$k; undo
      done
      on $HM || exit 1; ncu_k $S conv_masked m2v_chunk_conv 4096; undo
      on $LI; on $HM; timeline $S 512 )
    ;;
  c)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/c.tgz -C /tmp s51_c" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for p in $PATCHES; do on $D/$p || exit 1; done
      gpu_tests $S "prefill or packed or ragged or segment or conv" ${C_TEST_S:-240} )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

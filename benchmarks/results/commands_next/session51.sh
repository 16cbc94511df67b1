#!/bin/bash
# Session 51's calls, from the repository root on HEAD (the patches applied here):
#   OUT=/tmp/out bash benchmarks/results/commands_next/session51.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session51/README.md.
#   a: `lead_in_kernel.patch` (the tail's conv launch builds the window after each body from
#      the flat rows) and `head_masked.patch` on top (the body conv loads the pool's window
#      only in blocks that open a body): the prefill suite's chunked case on HEAD, with
#      lead_in, with both, twice; the timeline at R=512 with both; ncu of the body conv at
#      R=4096 on HEAD and with head_masked.
#   y: `ytail.patch` (the tail's SSM launch writes its y into the prefill's flat y; the rows'
#      copy launch goes): the prefill suite's chunked case on HEAD, with it, twice; then with
#      it the compiled tests of the prefill paths and the verify kernels (Y_TEST_S, default
#      240), the timeline at R=512, and issue 22's figures (`session44.sh goal`).
#   y2: `ytail2.patch` (ytail.patch, and the tail's verify launches read their rows from
#      the prefill's flat xbc, dt and z, so XLA's gathers of them go): timelines at R=512 and
#      4096 on HEAD, the chunked case on HEAD, with it, twice; then with it the compiled tests
#      as in y, the timelines at R=512 and 4096, issue 22's figures.
#   tab: `call_table.patch` (a snapshot prefill's body conv forms the per-sequence table from
#      cache_indices and state_row and writes it for the other kernels; no XLA op is left):
#      the chunked case on HEAD, with it, twice; with it the timeline at R=512, issue 22's
#      figures, then the whole GPU suite (TAB_TEST_S, default 330).
#   n: next session's first call (on an H200 if one comes): issue 22's figures, the
#      timelines at R=37, 512 and 4096 (the rows now arguments of the traced step), ncu of
#      the body conv at R=512 and 4096, then the whole GPU suite (N_TEST_S, default 480).
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
  y)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/y.tgz -C /tmp s51_y" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for k in 1 2; do ser $S head$k; on $D/ytail.patch || exit 1; ser $S y$k; undo; done
      on $D/ytail.patch || exit 1
      gpu_tests $S "prefill or packed or ragged or segment or conv or handoff" ${Y_TEST_S:-240}
      timeline $S 512
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt )
    ;;
  y2)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/y2.tgz -C /tmp s51_y2" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      mkdir -p $S/head; timeline $S/head 512; timeline $S/head 4096
      for k in 1 2; do ser $S head$k; on $D/ytail2.patch || exit 1; ser $S y$k; undo; done
      on $D/ytail2.patch || exit 1
      gpu_tests $S "prefill or packed or ragged or segment or conv or handoff" ${Y_TEST_S:-240}
      timeline $S 512; timeline $S 4096
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt )
    ;;
  tab)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/tab.tgz -C /tmp s51_tab" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for k in 1 2; do ser $S head$k; on $D/call_table.patch || exit 1; ser $S t$k; undo; done
      on $D/call_table.patch || exit 1
      timeline $S 512
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt
      gpu_tests $S "" ${TAB_TEST_S:-330} )
    ;;
  n)
    ( trap "tar czf ${OUT:-/tmp/out}/n.tgz -C /tmp s51_n" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt
      for R in 37 512 4096; do timeline $S $R; done
      ncu_k $S conv512 m2v_chunk_conv 512; ncu_k $S conv4096 m2v_chunk_conv 4096
      gpu_tests $S "" ${N_TEST_S:-480} )
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

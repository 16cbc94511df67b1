#!/bin/bash
# Session 46's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session46.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session46/README.md.
#   a1: `seq_table.patch` (session 45's c7), then `conv_end.patch` on top of it (the body conv
#       writes the conv state after each body into the pool; XLA's gather, select and scatter
#       of it gone). Each: the prefill suite's chunked case (B=1 bf16, R=512 and 4096) new,
#       old, new, old, left applied; the timeline at R=512 with both; then the compiled
#       tests of both (A1_TEST_S, default 200 s).
#   c8: session 45's c8 (`cst_last.patch` on the working tree: ab and ncu).
D=$(dirname "$0")
. $D/lib.sh   # ser, timeline, sweep, ab, gpu_tests
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  a1)
    S=/tmp/s46_a1; rm -rf $S; mkdir -p $S/seq $S/conv
    ( trap 'tar czf ${OUT:-/tmp/out}/a1.tgz -C /tmp s46_a1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ab $S/seq $D/seq_table.patch || exit 1
      ab $S/conv $D/conv_end.patch || exit 1
      timeline $S 512
      gpu_tests $S "packed or padding or reject or fills or tiles_match or body_conv or segment" \
        ${A1_TEST_S:-200} )
    ;;
  c8)
    bash $D/session45.sh c8
    ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

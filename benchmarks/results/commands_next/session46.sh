#!/bin/bash
# Session 46's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session46.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session46/README.md.
#   a1: `seq_table.patch` (session 45's c7), then `conv_end.patch` on top of it (the body conv
#       writes the conv state after each body into the pool; XLA's select, scatter and bounds reduce
#       of it gone). Each: the prefill suite's chunked case (B=1 bf16, R=512 and 4096) new,
#       old, new, old, left applied; the timeline at R=512 with both; then the compiled
#       tests of both (A1_TEST_S, default 200 s).
#   a2: chunk_sweep B=1 bf16 at R=4096 and 512 on the working tree: the table, then the body
#       conv's tiles (never swept): conv_rows 64, 16; conv_cols 512 in 8 warps, 128
#       (A2_VARIANTS, ChunkTiles texts joined by commas, overrides them).
#   b1: on a tree at HEAD: timelines at R=512 and 4096 of HEAD and of HEAD with
#       `seq_table.patch` (in b1/head, b1/seq); `conv_end2.patch` (the conv state's loads
#       issued before the rows) over seq: new, seq, new, seq (b1/conv2); then
#       `cst_last.patch` over HEAD: new, HEAD, new, HEAD (b1/cst). Leaves the tree at HEAD.
#   d1: on a tree at HEAD: timelines at R=4096 of HEAD, seq, HEAD, seq (d1/t1, t2); the
#       prefill suite's chunked case with `seq_table.patch`, HEAD, again (d1/seq); then
#       chunk_sweep at R=512 and 4096: the table, conv_rows=16, the table, conv_rows=16.
#   d2: d1 cut to what one short call holds: one timeline each of HEAD and seq at R=4096,
#       then seq, HEAD, seq, HEAD in the prefill suite (d2/seq).
#   c8: session 45's c8 (`cst_last.patch` on the working tree: ab and ncu).
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, ab, gpu_tests
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
  a2)
    S=/tmp/s46_a2; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/a2.tgz -C /tmp s46_a2' EXIT
      VS=${A2_VARIANTS:-$TB:conv_rows=64,$TB:conv_rows=16,$TB:conv_cols=512:conv_warps=8,$TB:conv_cols=128}
      for R in 4096 512; do
        T=${A2_T:-200} sweep $S conv_r$R $R "$VS"
      done )
    ;;
  b1)
    S=/tmp/s46_b1; rm -rf $S; mkdir -p $S/head $S/seq $S/cst
    ( trap 'tar czf ${OUT:-/tmp/out}/b1.tgz -C /tmp s46_b1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for R in 512 4096; do timeline $S/head $R; done
      patch -p1 < $D/seq_table.patch > /dev/null || exit 1
      for R in 512 4096; do timeline $S/seq $R; done
      mkdir -p $S/conv2; ab $S/conv2 $D/conv_end2.patch || exit 1
      patch -p1 -R < $D/conv_end2.patch > /dev/null || exit 1
      patch -p1 -R < $D/seq_table.patch > /dev/null || exit 1
      ab $S/cst $D/cst_last.patch || exit 1
      patch -p1 -R < $D/cst_last.patch > /dev/null || exit 1 )
    ;;
  d1)
    S=/tmp/s46_d1; rm -rf $S; mkdir -p $S/t1/head $S/t1/seq $S/t2/head $S/t2/seq $S/seq
    ( trap 'tar czf ${OUT:-/tmp/out}/d1.tgz -C /tmp s46_d1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for t in t1 t2; do
        timeline $S/$t/head 4096
        patch -p1 < $D/seq_table.patch > /dev/null || exit 1
        timeline $S/$t/seq 4096
        patch -p1 -R < $D/seq_table.patch > /dev/null || exit 1
      done
      ab $S/seq $D/seq_table.patch || exit 1
      patch -p1 -R < $D/seq_table.patch > /dev/null || exit 1
      for R in 512 4096; do
        T=120 sweep $S conv16_r$R $R "$TB:conv_rows=16,$TB,$TB:conv_rows=16"
      done )
    ;;
  d2)
    S=/tmp/s46_d2; rm -rf $S; mkdir -p $S/head $S/seq
    ( trap 'tar czf ${OUT:-/tmp/out}/d2.tgz -C /tmp s46_d2' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      timeline $S/head 4096
      patch -p1 < $D/seq_table.patch > /dev/null || exit 1
      timeline $S/seq 4096
      patch -p1 -R < $D/seq_table.patch > /dev/null || exit 1
      ab $S/seq $D/seq_table.patch || exit 1
      patch -p1 -R < $D/seq_table.patch > /dev/null || exit 1 )
    ;;
  c8)
    bash $D/session45.sh c8
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

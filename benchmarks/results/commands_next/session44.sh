#!/bin/bash
# Session 44's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session44.sh STAGE...
# Stages run one after another; each packs its outputs into $OUT/STAGE.tgz. Predictions:
# ../session44/README.md.
#   t3, w1, s1, g1: session43.sh's stages of those names.
#   o1: the output kernel's column blocks (`ChunkTiles.out_cols`) and loaded cumulative dt·A
#       (`out_acum`), chunk_sweep B=1 bf16 at R=4096 and 512 (O1_ROWS), then ncu of the
#       first output launch at R=512, the table's and O1_NCU's (a ChunkTiles text added to
#       the table's entry), and the compiled chunk-tile tests.
#   n2: ncu of the first output launch at R=2048 and 512, the table's and 128 rows, 8 warps,
#       32-column blocks, loaded acum, 3 stages.
#   goal: issue 22's figures: B=1 bf16 snapshot prefill, R=37 (the library's route) and
#       512, 4096 (chunked), and the ragged stage of tools/run_gpu.sh (8 prompts packed).
#   a1: `acum_product.patch` (each slot's cumulative dt·A as one product with a triangle of
#       ones instead of XLA's scan), the prefill suite's chunked case old, new, old; then the
#       timelines at R=4096 and 512 (old), with XLA's optimized HLO.
#   b1: the prefill suite's chunked case (B=1 bf16, R=512 and 4096): HEAD, with
#       `acum_product.patch`, with `pass_acum.patch` (the fused pass loads acum and acum_L
#       from the output kernel's sums instead of its scan and reduction), HEAD again.
#   o2: chunk_sweep B=1 bf16 at O2_ROWS (default 4096) of O2_VARIANTS (comma-separated
#       ChunkTiles texts, "V" standing for the previous table's fields), then B=8 at
#       O2_B8_ROWS against the previous table.
D=$(dirname "$0")
V=chunk=128:block_p=64:state_heads=16:state_stages=3:fused_pass=1   # the table's
. $D/lib.sh   # sweep, ncu_out, ser, timeline
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  t1|t2|t3|w1|s1|g1|p1|p2) bash $D/session43.sh $s ;;
  o1)
    S=/tmp/s44_o1; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/o1.tgz -C /tmp s44_o1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      A=out_acum=1
      for R in ${O1_ROWS:-4096 512}; do
        sweep $S cols_r$R $R "$V:$A,$V:out_cols=32:$A:out_stages=3,$V:out_cols=32:$A:out_stages=2,$V:out_rows=128:out_cols=32:$A:out_stages=3:out_warps=8,$V:out_rows=128:out_cols=64:$A:out_stages=2:out_warps=8,$V:out_cols=32:out_stages=3"
      done
      F=m2v_jax/kernels/tiles.py
      cp $F $S/tiles.py.orig
      ncu_out $S table
      sed -i "s/block_p=64, fused_pass=1, state_stages=3)/block_p=64, fused_pass=1, state_stages=3, ${O1_NCU:-out_cols=32, out_acum=1, out_stages=3})/" $F
      grep -q "${O1_NCU:-out_cols=32, out_acum=1, out_stages=3})" $F && ncu_out $S variant
      cp $S/tiles.py.orig $F && rm $S/tiles.py.orig
      M2V_STAGES=gpu_tests M2V_GPU_TESTS_K="chunk_tiles_match or chunk_extreme" \
        M2V_LIMIT_GPU_TESTS=150 OUT=$S bash tools/run_gpu.sh > $S/run.txt 2>&1
      tail -3 $S/gpu_tests.log )
    ;;
  o2)
    S=/tmp/s44_o2; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/o2.tgz -C /tmp s44_o2' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for R in ${O2_ROWS:-4096}; do
        sweep $S vars_r$R $R "$(echo $O2_VARIANTS | sed "s/V:/$V:/g; s/^V,/$V,/; s/,V,/,$V,/g; s/^V$/$V/")"
      done
      for R in ${O2_B8_ROWS:-}; do
        BATCH=8 sweep $S vars_b8_r$R $R "$V"
      done )
    ;;
  n2)
    S=/tmp/s44_n2; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/n2.tgz -C /tmp s44_n2' EXIT
      F=m2v_jax/kernels/tiles.py
      cp $F $S/tiles.py.orig
      for R in 2048 512; do
        cp $S/tiles.py.orig $F; NCU_ROWS=$R ncu_out $S table_r$R
        sed -i "s/chunk=128, out_rows=64,/chunk=128, out_rows=128,/; s/block_p=64, fused_pass=1, state_stages=3)/block_p=64, fused_pass=1, state_stages=3, out_cols=32, out_acum=1, out_stages=3, out_warps=8)/" $F
        grep -q "out_warps=8)" $F && NCU_ROWS=$R ncu_out $S r128c32_r$R
      done
      cp $S/tiles.py.orig $F && rm $S/tiles.py.orig )
    ;;
  goal)
    S=/tmp/s44_goal; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/goal.tgz -C /tmp s44_goal' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      for spec in 37:serial 512,4096:chunked; do
        n=prefill_$(echo ${spec%%:*} | tr , _)
        PYTHONPATH=$PWD timeout -k 5 120 python3 benchmarks/bench.py --suites=prefill \
          --prefill_batch=1 --lengths=${spec%:*} --prefill_cases=${spec#*:} \
          --out=$S/$n.json > $S/$n.log 2>&1
        grep -hE "^\| (snap|comp)|rror" $S/$n.log | cut -c1-120
      done
      M2V_STAGES=ragged M2V_LIMIT_RAGGED=150 OUT=$S bash tools/run_gpu.sh > $S/run.txt 2>&1
      grep -hE "^\| |rror" $S/ragged.log | cut -c1-140 | head -12 )
    ;;
  a1)
    S=/tmp/s44_a1; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/a1.tgz -C /tmp s44_a1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      P=$D/acum_product.patch
      ser $S old
      patch -p1 < $P > /dev/null || exit 1
      ser $S new
      patch -p1 -R < $P > /dev/null || exit 1
      ser $S old2
      for R in 4096 512; do timeline $S $R; done )
    ;;
  b1)
    S=/tmp/s44_b1; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/b1.tgz -C /tmp s44_b1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ser $S old
      for P in acum_product pass_acum; do
        patch -p1 < $D/$P.patch > /dev/null || exit 1
        ser $S $P
        patch -p1 -R < $D/$P.patch > /dev/null || exit 1
      done
      ser $S old2 )
    ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

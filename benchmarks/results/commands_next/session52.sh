#!/bin/bash
# Session 52's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session52.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session52/README.md.
#   h: (for an H200) issue 22's figures (`session44.sh goal`), "highest" at R=4096, the
#      timelines at R=37, 512 and 4096, ncu of the body conv at R=512, and the snapshot
#      tree suite at B=32 (16 rows, chains beside).
#   x: chunk_sweep B=1 at "highest" (R=4096) of
#      the fused kernel (fused_y) at 64- and 128-row chunks against the table's three
#      kernels; chunk_sweep B=1 at bf16 of the fused kernel at 64-row chunks and 4 warps (P
#      tiles of 64: 128 programs at B=1; of 32: 256 programs, two an SM), R=512 and 4096.
#   hf: `highest_fused.patch` (Bolt's "highest" with bfloat16 activations in the fused
#      kernel at 64-row chunks): the prefill suite's "highest" case at R=512 and 4096 on
#      HEAD and with it, twice; with it, the compiled tests of the precisions and Bolt's
#      chunked prefill (HF_TEST_S, default 240); then on HEAD ncu of the body conv at R=512
#      (sections).
#   z: chunk_sweep B=1 at "highest" of the fused kernel at 64-row chunks (at R=4096 also
#      with y in 32-row blocks) against the table's three kernels, R=4096 and 512; then `highest_fused.patch` applied, the
#      compiled tests as in hf (Z_TEST_S, default 230).
#   l: on the tree as it stands (Bolt's bf16 entry at 64-row chunks and 4 warps, "highest"
#      with bfloat16 activations in the fused kernel): issue 22's figures, then the compiled
#      tests of the prefill paths, the verify conv, the hand-offs and the precisions
#      (L_TEST_S, default 260).
#   th: the serial / chunked ties at B=1 (bf16 activations): serial against chunked (bf16
#      products) at R=104-296, serial against chunked "highest" at R=232-472; the
#      thresholds (`dispatch.MIN_CHUNKED_ROWS*`) were set against the earlier kernels.
#   u: the whole GPU suite (U_TEST_S, default 560).
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, gpu_tests, ncu_k, run, rows
S1=$(echo $TB | sed 's/state_stages=3/state_stages=1/; s/out_cols=32/out_cols=128/'):state_warps=8:fused_y=1  # the table's
C64=$(echo $S1 | sed 's/chunk=128/chunk=64/; s/out_rows=128/out_rows=64/; s/out_cols=128/out_cols=64/; s/state_warps=8/state_warps=4/')
C64P32=${C64/block_p=64/block_p=32}
HF128=$S1; HF64=${C64/state_warps=4/state_warps=8}   # "highest": the fused kernel (8 warps)
HF64R32=${HF64/out_rows=64:out_cols=64/out_rows=32:out_cols=32}   # its y in 32-row blocks
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s52_$s; rm -rf $S; mkdir -p $S
  case $s in
  h)
    ( trap "tar czf ${OUT:-/tmp/out}/h.tgz -C /tmp s52_h" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt
      PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
        --prefill_batch=1 --lengths=4096 --prefill_cases=highest --out=$S/highest.json \
        > $S/highest.log 2>&1; grep -hE "^\| (snap|chunk)|rror" $S/highest.log | cut -c1-110
      for R in 37 512 4096; do timeline $S $R; done
      ncu_k $S conv512 m2v_chunk_conv 512
      O=$S run tree M2V_STAGES=tree M2V_LIMIT_TREE=200 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16"
      rows $S/tree/tree.log )
    ;;
  x)
    ( trap "tar czf ${OUT:-/tmp/out}/x.tgz -C /tmp s52_x" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      PREC="--prefill_precision=highest" T=240 sweep $S hi4096 4096 "$HF64,$HF128"
      T=100 sweep $S r512 512 "$C64,$C64P32"
      T=140 sweep $S r4096 4096 "$C64,$C64P32" )
    ;;
  z)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/z.tgz -C /tmp s52_z" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      PREC="--prefill_precision=highest" T=220 sweep $S hi4096 4096 "$HF64,$HF64R32"
      PREC="--prefill_precision=highest" T=100 sweep $S hi512 512 "$HF64"
      on $D/highest_fused.patch || exit 1
      gpu_tests $S "highest or precision or bolt_chunked" ${Z_TEST_S:-230} )
    ;;
  l)
    ( trap "tar czf ${OUT:-/tmp/out}/l.tgz -C /tmp s52_l" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt
      gpu_tests $S "prefill or packed or ragged or segment or conv or handoff or highest or precision" \
        ${L_TEST_S:-260} )
    ;;
  hf)
    ( HF=$D/highest_fused.patch
      trap "undo; tar czf ${OUT:-/tmp/out}/hf.tgz -C /tmp s52_hf" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      hser() { PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
        --prefill_batch=1 --lengths=512,4096 --prefill_cases=highest --out=$S/$1.json \
        > $S/$1.log 2>&1; echo $1; grep -hE "^\| (snap|chunk)|rror" $S/$1.log | cut -c1-110; }
      for k in 1 2; do hser head$k; on $HF || exit 1; hser new$k; undo; done
      on $HF || exit 1
      gpu_tests $S "highest or precision or bolt_chunked" ${HF_TEST_S:-240}
      undo
      PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu \
        --clock-control none --kernel-name regex:m2v_chunk_conv --launch-skip 0 \
        --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=512 \
        --calls=1 > $S/ncu_conv512_sections.log 2>&1
      grep -E "Duration|Registers Per|Grid Size|Waves|Achieved Occ|One or More|DRAM Through|Warp Cycles Per Issued" \
        $S/ncu_conv512_sections.log | head -12 )
    ;;
  th)
    ( trap "tar czf ${OUT:-/tmp/out}/th.tgz -C /tmp s52_th" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      for spec in 104,136,168,232,296:serial,chunked 232,296,360,408,472:serial,highest; do
        n=th_$(echo ${spec#*:} | tr , _)
        PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill \
          --prefill_batch=1 --lengths=${spec%:*} --prefill_cases=${spec#*:} \
          --out=$S/$n.json > $S/$n.log 2>&1
        grep -hE "^\| (snap|comp)|rror" $S/$n.log | cut -c1-110
      done )
    ;;
  u)
    ( trap "tar czf ${OUT:-/tmp/out}/u.tgz -C /tmp s52_u" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      gpu_tests $S "" ${U_TEST_S:-560} )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

#!/bin/bash
# Session 54's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session54.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session54/README.md.
#   hb: "highest" with bfloat16 activations, serial against chunked (the prefill suite's
#       `serial` and `highest` cases): B=1 near the tie (R=168-232), B=2 and 4 at R=360-2000,
#       B=8 at R=1000 and 2000 (session 54's call 1 measured B=8 R=232-472); HB_SPECS="B:R,R ..."
#       replaces those, HB_CASES the prefill suite's cases (serial,chunked: bf16 products).
#   tl: timelines of the bf16 chunked prefill at B=8, R=1712 (8 x 1712 rows, about the packed
#       suite's 13,700) and B=1, R=512: the verify tail's share (its SSM launch writes the
#       capacity's states of every sequence).
#   ya: `y_after_chain.patch` applied (`TileConfig.tree_y_after=1` then also moves a snapshot
#       chain's y after its rows' states, so the state stores drain while y is computed):
#       the table against the variant, B=1 bf16 serial prefill R=37 and 72, and snapshot
#       verify R=8 at B=32 (the sweep suite); the patch is reversed at the end.
#   g:  (an H200) issue 22's figures (`session44.sh goal`) and "highest" at R=4096, B=1.
#   t:  the compiled GPU tests of the prefill paths and precisions (T_TEST_S seconds).
#   ft: (not yet run) `fused_tail_states.patch` (the verify tail's kept states stored by the
#       fused kernel; `ChunkTiles.tail_states`) with `fused_tail_default.patch` (Bolt's bf16
#       entry takes it), interleaved with the library's code: the prefill suite's chunked
#       R=512 and 4096 and the ragged suite (packed, one prompt, one by one), B=1 bf16.
#   ftt: (not yet run) the two patches' compiled tests (test_packed's tail_states test, the
#       packed and prefill hand-off and parity tests), FTT_TEST_S seconds.
D=$(dirname "$0")
. $D/lib.sh
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s54_$s; rm -rf $S; mkdir -p $S
  case $s in
  hb)
    ( trap "tar czf ${OUT:-/tmp/out}/hb.tgz -C /tmp s54_hb" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      for spec in ${HB_SPECS:-1:168,200,232 2:360,600,1000,2000 4:600,1000,2000 8:1000,2000}; do
        b=${spec%%:*}
        PYTHONPATH=$PWD timeout -k 5 ${HB_S:-150} python3 benchmarks/bench.py --suites=prefill \
          --prefill_batch=$b --lengths=${spec#*:} --prefill_cases=${HB_CASES:-serial,highest} \
          --out=$S/hb_b$b.json > $S/hb_b$b.log 2>&1
        grep -hE "^\| (snap|comp)|rror" $S/hb_b$b.log | cut -c1-110
      done )
    ;;
  tl)
    ( trap "tar czf ${OUT:-/tmp/out}/tl.tgz -C /tmp s54_tl" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      for br in 8:1712 1:512; do
        PYTHONPATH=$PWD timeout -k 5 120 python3 tools/trace_call.py --prefill --mode=snapshot \
          --batch=${br%%:*} --rows=${br#*:} --calls=1 --steps=3 --show=40 \
          > $S/trace_b${br%%:*}_r${br#*:}.log 2>&1
        echo "B=${br%%:*} R=${br#*:}"; grep -E "^\||per call" $S/trace_b${br%%:*}_r${br#*:}.log | cut -c1-100
      done )
    ;;
  ya)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/ya.tgz -C /tmp s54_ya" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/y_after_chain.patch || exit 1
      PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
        --lengths=37,72 --prefill_cases=serial --serial_tiles=32:4:64:tree_y_after=1 \
        --out=$S/ya_prefill.json > $S/ya_prefill.log 2>&1
      grep -hE "^\| snap|rror" $S/ya_prefill.log | cut -c1-150
      PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=sweep \
        --sweep_batches=32 --sweep_modes=snapshot --sweep_tiles=64:4:64:tree_y_after=1 \
        --out=$S/ya_sweep.json > $S/ya_sweep.log 2>&1
      grep -hE "^\| snap|rror" $S/ya_sweep.log | cut -c1-150 )
    ;;
  g)
    ( trap "tar czf ${OUT:-/tmp/out}/g.tgz -C /tmp s54_g" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      OUT=$S bash $D/session44.sh goal > $S/goal.txt 2>&1; tail -9 $S/goal.txt
      PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
        --prefill_batch=1 --lengths=4096 --prefill_cases=highest --out=$S/highest.json \
        > $S/highest.log 2>&1; grep -hE "^\| (snap|chunk)|rror" $S/highest.log | cut -c1-110 )
    ;;
  t)
    ( trap "tar czf ${OUT:-/tmp/out}/t.tgz -C /tmp s54_t" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      gpu_tests $S "prefill or packed or highest or precision" ${T_TEST_S:-240} )
    ;;
  ft)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/ft.tgz -C /tmp s54_ft" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      ftg() {
        PYTHONPATH=$PWD timeout -k 5 ${FTG_S:-130} python3 benchmarks/bench.py \
          --suites=prefill,ragged --lengths=512,4096 --prefill_cases=chunked \
          --out=$S/$1.json > $S/$1.log 2>&1
        echo "$1"; grep -hE "^\| (snap|pack|one|ragg)|rror" $S/$1.log | cut -c1-130; }
      for k in 1 2; do
        ftg old$k
        on $D/fused_tail_states.patch && on $D/fused_tail_default.patch || exit 1
        ftg new$k
        undo
      done )
    ;;
  ftt)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/ftt.tgz -C /tmp s54_ftt" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/fused_tail_states.patch && on $D/fused_tail_default.patch || exit 1
      gpu_tests $S "tail_states or packed or handoff or bitwise or prefill" ${FTT_TEST_S:-300} )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

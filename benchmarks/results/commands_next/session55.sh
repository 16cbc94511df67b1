#!/bin/bash
# Session 55's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session55.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session55/README.md.
#   nt:  ncu of every m2v kernel of one B=1 bf16 snapshot prefill of 512 rows (chunked), with
#        `fused_tail_states.patch` + `fused_tail_default.patch` applied, then without.
#   n37: ncu of the two launches of a B=1 bf16 snapshot prefill of 37 rows (verify kernels).
#   fp:  `fused_tail_states.patch`, `fused_tail_default.patch` and `fused_tail_prefetch.patch`
#        (the tail rows' loads before the first slot store) interleaved with the library's
#        code: the prefill suite's chunked R=512 and the ragged suite, B=1 bf16; then a
#        timeline of B=8 R=1712 with the patch.
#   ck:  `conv_body_loads.patch` (the conv launch loads a short body's rows with the kept
#        rows', before its barrier), then with `kept_rows_loads.patch` too (a snapshot call's
#        kept rows loaded before the first update, in P tiles of 32, after a body of one
#        segment), against the library's code: old, conv, both, twice; B=1 bf16 serial
#        prefill at R=20, 37, 40 (both patches apply) and 72 (the conv patch only).
#        Alone in a call: six runs of up to CK_S (90) seconds each.
#   ckt: the compiled tests of the serial paths and snapshot mode with both patches applied
#        (CKT_TEST_S seconds).
D=$(dirname "$0")
. $D/lib.sh
M=gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,sm__inst_executed.sum,\
dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,\
smsp__warp_issue_stalled_barrier_per_warp_active.pct,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_wait_per_warp_active.pct,\
smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_drain_per_warp_active.pct,\
smsp__warp_issue_stalled_membar_per_warp_active.pct
nall() {  # nall DIR NAME N ARGS...: ncu of the N m2v launches of the call after the warm-up
  local dir=$1 name=$2 n=$3; shift 3
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 ${NCU_S:-120} ncu \
    --clock-control none --kernel-name regex:m2v_ --launch-skip $n --launch-count $n \
    --metrics $M python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --calls=1 \
    "$@" > $dir/ncu_$name.log 2>&1
  echo "ncu $name"; grep -vE "^I1|WARN" $dir/ncu_$name.log | grep -E "m2v|  [a-z]|rror" \
    | sed 's/  */ /g' | cut -c1-110
}
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s55_$s; rm -rf $S; mkdir -p $S
  case $s in
  nt)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/nt.tgz -C /tmp s55_nt" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/fused_tail_states.patch && on $D/fused_tail_default.patch || exit 1
      nall $S new 4 --rows=512
      undo
      nall $S old 4 --rows=512 )
    ;;
  n37)
    ( trap "tar czf ${OUT:-/tmp/out}/n37.tgz -C /tmp s55_n37" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      nall $S r37 2 --rows=37 --nochunked )
    ;;
  fp)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/fp.tgz -C /tmp s55_fp" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      fpg() {
        PYTHONPATH=$PWD timeout -k 5 ${FPG_S:-110} python3 benchmarks/bench.py \
          --suites=prefill,ragged --lengths=512 --prefill_cases=chunked \
          --out=$S/$1.json > $S/$1.log 2>&1
        echo "$1"; grep -hE "^\| (snap|pack|one)|rror" $S/$1.log | cut -c1-110; }
      for k in $(seq ${FP_PAIRS:-2}); do
        fpg old$k
        on $D/fused_tail_states.patch && on $D/fused_tail_default.patch \
          && on $D/fused_tail_prefetch.patch || exit 1
        fpg new$k
        [ $k = ${FP_PAIRS:-2} ] || undo
      done
      PYTHONPATH=$PWD timeout -k 5 120 python3 tools/trace_call.py --prefill --mode=snapshot \
        --batch=8 --rows=1712 --calls=1 --steps=3 --show=40 > $S/trace_b8_new.log 2>&1
      grep -E "^\||per call" $S/trace_b8_new.log | cut -c1-100 )
    ;;
  ck)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/ck.tgz -C /tmp s55_ck" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      ckg() {  # ckg NAME: the serial prefill at R=20, 37, 40 and 72 (CK_LENGTHS); the
        # results so far packed after each run (a run cut off by the call's limit keeps them)
        PYTHONPATH=$PWD timeout -k 5 ${CK_S:-90} python3 benchmarks/bench.py --suites=prefill \
          --lengths=${CK_LENGTHS:-20,37,40,72} --prefill_cases=serial --out=$S/$1.json \
          > $S/$1.log 2>&1
        echo "$1"; grep -hE "^\| snap|rror" $S/$1.log | cut -c1-120
        tar czf ${OUT:-/tmp/out}/ck.tgz -C /tmp s55_ck; }
      for k in 1 2; do
        ckg old$k
        on $D/conv_body_loads.patch || exit 1
        ckg conv$k
        on $D/kept_rows_loads.patch || exit 1
        ckg both$k
        undo
      done )
    ;;
  ckt)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/ckt.tgz -C /tmp s55_ckt" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/conv_body_loads.patch && on $D/kept_rows_loads.patch || exit 1
      gpu_tests $S "prefill or snapshot or state_dtype or serial" ${CKT_TEST_S:-300} )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

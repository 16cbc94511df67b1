#!/bin/bash
# Session 56's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session56.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session56/README.md.
#   c1: `conv_body_loads.patch` with one tile unrolled (UNROLL_TILES = 1: bodies of at most
#       32 rows load before the barrier; longer ones keep the loop) against the library's
#       code, old / one, twice; B=1 bf16 serial prefill at R=20, 37, 40 and 72. Then ncu of
#       the conv launch at R=72 with the patch as written (two tiles) and without.
#   c2: `conv_short_body.patch` (the conv patch where a body's tiles cover at most 32 rows:
#       R=9-40 at capacity 8) against the library's code, old / new, twice; R=20, 37, 40, 41
#       and 72. Then ncu of the conv launch at R=72 with `conv_body_loads.patch` as written,
#       with the stalls call 3 did not count (no instruction, lg throttle, ...).
#   c2t: the compiled tests of the serial paths and snapshot mode with `conv_short_body.patch`
#       applied (C2T_TEST_S seconds).
#   n72: ncu of R=72's conv launch with `conv_body_loads.patch` and without: the busiest SM's
#       active cycles against the average (is one program, the dt one or a conv one, the
#       long pole?).
# The bf16-product ties at B=3, 4, 5 and 16 run as session54.sh's `hb` with other cases:
#   HB_CASES=serial,chunked HB_SPECS="3:56,72,104,136 4:56,72,104,136 5:56,72,104,136
#   16:56,72,104,136" bash benchmarks/results/commands_next/session54.sh hb
D=$(dirname "$0")
. $D/lib.sh
conv72() {  # conv72 METRICS: ncu of R=72's conv launch (B=1 bf16 serial), the library's code
  # then with `conv_body_loads.patch`, with the further METRICS (",name,name...")
  NCU_MORE=$1 PROFILE_ARGS=--nochunked ncu_k $S conv72_old m2v_conv 72
  on $D/conv_body_loads.patch || return 1
  NCU_MORE=$1 PROFILE_ARGS=--nochunked ncu_k $S conv72_two m2v_conv 72
  undo; }
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s56_$s; rm -rf $S; mkdir -p $S
  case $s in
  c1)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/c1.tgz -C /tmp s56_c1" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      sed 's/^+UNROLL_TILES = 2 /+UNROLL_TILES = 1 /' $D/conv_body_loads.patch > $S/one_tile.patch
      grep -q "^+UNROLL_TILES = 1 " $S/one_tile.patch || exit 1
      for k in 1 2; do
        serg old$k 20,37,40,72
        on $S/one_tile.patch || exit 1
        serg one$k 20,37,40,72
        undo
      done
      conv72 ,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum )
    ;;
  c2)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/c2.tgz -C /tmp s56_c2" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      for k in 1 2; do
        serg old$k 20,37,40,41,72
        on $D/conv_short_body.patch || exit 1
        serg new$k 20,37,40,41,72
        undo
      done
      conv72 ,smsp__warp_issue_stalled_no_instruction_per_warp_active.pct,\
smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_branch_resolving_per_warp_active.pct,\
smsp__warp_issue_stalled_not_selected_per_warp_active.pct,\
smsp__warp_issue_stalled_selected_per_warp_active.pct,\
smsp__warp_issue_stalled_dispatch_stall_per_warp_active.pct,\
smsp__warp_issue_stalled_drain_per_warp_active.pct )
    ;;
  c2t)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/c2t.tgz -C /tmp s56_c2t" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      on $D/conv_short_body.patch || exit 1
      gpu_tests $S "prefill or snapshot or state_dtype or serial" ${C2T_TEST_S:-300} )
    ;;
  n72)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/n72.tgz -C /tmp s56_n72" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      conv72 ,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max,\
smsp__warp_issue_stalled_no_instruction_per_warp_active.pct )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

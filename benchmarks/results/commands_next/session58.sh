#!/bin/bash
# Session 58's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session58.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session58/README.md.
#   p: where the packed call's time goes (the ragged suite's 8 prompts, 13,700 rows, bf16):
#      its device timeline (tools/trace_call.py --packed), then ncu of its fused kernel, its
#      body conv and its tail's SSM launch: occupancy and its limits, the busiest SM's active
#      cycles against the average, DRAM throughput.
#   f: `fused_fill.patch` (the fused kernel fills the slots past each sequence's rows; no fill
#      launch) against the library: the packed call's timeline old and new, then the ragged
#      suite new and old, the outputs packed after each step; then, if FN=1, ncu of the
#      packed call's fused kernel with it (the steps' timeouts then pass 600 s: run
#      `FN=1` in a call of its own, or stage `f` alone without it).
D=$(dirname "$0")
. $D/lib.sh
LENS=300,4000,1500,800,3100,600,2200,1200
ncu_p() {  # ncu_p DIR NAME REGEX: ncu of the packed call's first launch matching REGEX
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 ${NCU_S:-120} ncu \
    --clock-control none --kernel-name regex:$3 --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,launch__block_size,\
launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers,\
launch__occupancy_limit_shared_mem,launch__occupancy_limit_warps,\
sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.max,sm__cycles_active.avg,\
dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_barrier_per_warp_active.pct \
    python3 tools/profile_call.py --mode=snapshot --packed=$LENS --calls=0 > $1/ncu_$2.log 2>&1
  echo "ncu $2"; grep -vE "^I1|WARN" $1/ncu_$2.log | grep -E "m2v|  [a-z]|rror" | tail -20
}
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s58_$s; rm -rf $S; mkdir -p $S
  case $s in
  p)
    ( trap "tar czf ${OUT:-/tmp/out}/p.tgz -C /tmp s58_p" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      PYTHONPATH=$PWD timeout -k 5 150 python3 tools/trace_call.py --mode=snapshot \
        --packed=$LENS --calls=2 --steps=3 --show=40 > $S/trace.log 2>&1
      grep -E "^\||per call|  m2v|  [a-z]" $S/trace.log | cut -c1-100
      ncu_p $S fused m2v_chunk_fused
      ncu_p $S conv m2v_chunk_conv
      ncu_p $S tail_ssm m2v_ssm )
    ;;
  f)
    ( trap "undo; tar czf ${OUT:-/tmp/out}/f.tgz -C /tmp s58_f" EXIT
      trap "exit 1" TERM INT
      timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      packed_trace() {
        PYTHONPATH=$PWD timeout -k 5 120 python3 tools/trace_call.py --mode=snapshot \
          --packed=$LENS --calls=2 --steps=3 --show=40 > $S/trace_$1.log 2>&1
        echo "trace $1"; grep -E "^\| m2v|^\| [a-z_.0-9]+ \||per call|  [a-z]" $S/trace_$1.log \
          | cut -c1-100 | tail -24
        tar czf ${OUT:-/tmp/out}/f.tgz -C /tmp s58_f; }
      ragged_suite() {
        PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=ragged \
          --out=$S/ragged_$1.json > $S/ragged_$1.log 2>&1
        echo "ragged $1"; grep -hE "^\| (pack|one|ragg)|rror" $S/ragged_$1.log | cut -c1-130
        tar czf ${OUT:-/tmp/out}/f.tgz -C /tmp s58_f; }
      packed_trace old
      on $D/fused_fill.patch || exit 1
      packed_trace new; ragged_suite new
      undo
      ragged_suite old
      [ "${FN:-0}" = 1 ] || exit 0
      on $D/fused_fill.patch || exit 1
      ncu_p $S fused_new m2v_chunk_fused )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

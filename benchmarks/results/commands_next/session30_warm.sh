#!/bin/bash
# Session 30: the compact fold's pending rows prefetched into L1 (`backend.prefetch_l1`), the
# fold then loading each row in its own iteration (no row carried ahead). One device call of
# ~6 minutes, from the repository root of the tree with the change (ran 2026-12-05 on an H100,
# with the base made by reversing the patch in a copy; now that the change is not landed,
# apply benchmarks/results/patches/warm_fold.patch to the tree first):
#   OUT=/tmp/out bash benchmarks/results/commands_next/session30_warm.sh call1
# call1: the base (a copy with warm_fold.patch reversed) against the tree: y and every state
#   leaf bitwise (compact, float32 state); the loop suite (B=8-128, default window) of the
#   base and the tree in turn twice, and B=1 of each; ncu of each compact SSM kernel at B=32;
#   the tree's kernel's stalls per SASS instruction (ncu SourceCounters, exported as CSV).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_next
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,l1tex__t_sector_hit_rate.pct
BASE=/tmp/m2v_base; rm -rf $BASE; mkdir -p $BASE && cp -r m2v_jax $BASE/ \
  && (cd $BASE && patch -s -R -p1 < $OLDPWD/benchmarks/results/patches/warm_fold.patch) || exit 1
# (It also timed a copy with the state loaded `.cg`, a patch not kept: it failed to lower.)
loop() {  # loop NAME SECONDS ARGS...: the loop suite, its table rows kept
  local n=$1 s=$2; shift 2
  echo "=== $n $(date -u +%T)"
  timeout -k 5 $s python3 benchmarks/bench.py --suites=loop --vary_batches= "$@" \
    --out=$O/$n.json 2>&1 | grep -E "^\||Error|error" | tee $O/$n.txt
}
ncu_short() {  # ncu_short NAME PYTHONPATH: the compact SSM kernel of the call after the warm-up
  echo "=== ncu $1 $(date -u +%T)"
  PYTHONPATH=$2 timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_ssm \
    --launch-skip 1 --launch-count 1 --metrics $M python3 tools/profile_call.py --mode=compact \
    --batch=32 --calls=1 2>&1 | grep -E "m2v_|  [a-z0-9_]+__" | sed 's/  */ /g' | tee $O/ncu_$1.txt
}
case ${1:-} in
  call1)
    echo "=== bitwise $(date -u +%T)"
    PYTHONPATH=$BASE:$PWD timeout -k 5 90 python3 tools/tiles_bitwise.py --tiles=64:4:64 \
      --modes=compact --save=/tmp/base.npz 2>&1 | tail -2 | tee $O/bitwise.txt
    timeout -k 5 90 python3 tools/tiles_bitwise.py --tiles=64:4:64 --modes=compact \
      --against=/tmp/base.npz 2>&1 | tail -3 | tee -a $O/bitwise.txt
    for i in 1 2; do
      PYTHONPATH=$BASE:$PWD loop loop_base_$i 80 --windows= --batches=8,32,128
      loop loop_warm_$i 80 --windows= --batches=8,32,128
    done
    PYTHONPATH=$BASE:$PWD loop loop_base_b1 60 --windows= --batches=1
    loop loop_warm_b1 60 --windows= --batches=1
    ncu_short base $BASE:$PWD
    ncu_short warm $PWD
    echo "=== ncu source $(date -u +%T)"
    timeout -k 5 120 ncu --clock-control none --kernel-name regex:m2v_ssm --launch-skip 1 \
      --launch-count 1 --section SourceCounters --section WarpStateStats -f -o /tmp/src_warm \
      python3 tools/profile_call.py --mode=compact --batch=32 --calls=1 > $O/src_warm.log 2>&1
    timeout -k 5 60 ncu --import /tmp/src_warm.ncu-rep --page source --csv --print-source sass \
      > /tmp/src_warm.csv 2>&1; gzip -c /tmp/src_warm.csv > $O/src_warm.csv.gz
    timeout -k 5 60 ncu --import /tmp/src_warm.ncu-rep --page details 2>&1 | tail -60 \
      | tee $O/src_warm_details.txt ;;
  *) echo "usage: $0 call1"; exit 2 ;;
esac
echo "=== done $(date -u +%T)"

#!/bin/bash
# Session 42's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session42.sh CALL
# Outputs go to /tmp/s42_CALL and are packed into $OUT/CALL.tgz (also when a case stops early).
# Predictions: ../session42/README.md. Calls 1 and 2 were session41.sh c6 and c5.
#   c3: the whole GPU suite (session40.sh suite, LIMIT=540).
#   c4: on an H200: session39.sh h200tree (slot streams, snapshot trees and chains at B=32,
#       16 rows, tree_cache=1 and tree_recompute=0); the ragged prefill suite (8 prompts);
#       the output kernel at out_warps=8, out_rows=128 and both against the table (chunk_sweep,
#       R=4096 and 512); the B=1 R=37 serial prefill's timeline; the B=1 prefill in both modes
#       (compact: nothing pending) at R=37 (serial) and 512, 4096 (chunked) (~7-9 min).
#   c5: chunk_sweep at R=4096 and 512 of out_rows 64 and 128 at out_warps 4 and 8 (the case
#       that c4 meant to run: c4's variants named out_rows twice then).
#   c6: chunk_sweep at R=1024, 2048, 4096 of out_rows=128, out_warps=8 against the table.
#   c7: the output kernel at out_rows=128, out_warps=8 against the table's 64 and 4: B=1 R=4096 and
#       2048 prefill timelines of each (per kernel), then on an H200 chunk_sweep at R=4096,
#       2048 and 512, then ncu of the output kernel at R=2048 for each (~6 min; NCU=0: no ncu,
#       SWEEP="4096 2048": those lengths only).
#   c8: chunk_sweep at R=2048 of the table and 128/8 in one and two segments (scratch_mb 50).
#   n1: (for session 43) R=2048, B=1 bf16: the table and 128/8 output tiles in one and two
#       segments (scratch_mb 100 and 50) by chunk_sweep, then again with dt0_always.patch
#       (dt0 from a pointer with one segment too); ncu of the output kernel at R=2048 for
#       the table and 128/8 in one and two segments (~6 min).
set -u
D=$(dirname "$0")
S=/tmp/s42_$1; rm -rf $S; mkdir -p $S
trap 'tar czf ${OUT:-/tmp/out}/$1.tgz -C /tmp s42_$1' EXIT
V=chunk=128:block_p=64:state_heads=16:state_stages=3:fused_pass=1   # the table's, but out_rows
sweep() {  # sweep NAME ROWS VARIANTS: chunk_sweep rows (the table first, then each variant)
  PYTHONPATH=$PWD timeout -k 5 ${T:-110} python3 benchmarks/bench.py --suites=chunk_sweep \
    --chunk_rows=$2 --chunk_variants=$3 --out=$S/$1.json > $S/$1.log 2>&1
  echo "$1"; grep -hE "^\| c|rror" $S/$1.log | sed "s/ (rel_err[^)]*)//" \
    | sed "s/block_p=64 num_warps.*state_stages=3//" | cut -c1-200
}
case "$1" in
c3)
  OUT=$S LIMIT=540 bash $D/session40.sh suite
  ;;
c5)
  for R in 4096 512; do
    sweep tiles_r$R $R $V:out_rows=64,$V:out_rows=64:out_warps=8,$V:out_rows=128,$V:out_rows=128:out_warps=8
  done
  ;;
c6)
  for R in 1024 2048 4096; do sweep tiles_r$R $R $V:out_rows=64,$V:out_rows=128:out_warps=8; done
  ;;
c8)
  sweep seg_r2048 2048 $V:out_rows=64:scratch_mb=50,$V:out_rows=128:out_warps=8:scratch_mb=50,$V:out_rows=64,$V:out_rows=128:out_warps=8
  ;;
c4)
  nvidia-smi --query-gpu=name --format=csv,noheader
  OUT=$S M2V_LIMIT_TREE=200 bash $D/session39.sh h200tree
  source $D/lib.sh; O=$S
  run ragged M2V_STAGES=ragged M2V_LIMIT_RAGGED=150
  rows $S/ragged/ragged.log
  for R in 4096 512; do
    sweep tiles_r$R $R $V:out_rows=64:out_warps=8,$V:out_rows=128,$V:out_rows=128:out_warps=8
  done
  for spec in 37:serial,compact_serial 512,4096:chunked,compact_chunked; do
    PYTHONPATH=$PWD timeout -k 5 90 python3 benchmarks/bench.py --suites=prefill \
      --prefill_batch=1 --lengths=${spec%:*} --prefill_cases=${spec#*:} \
      --out=$S/modes_$(echo ${spec%%:*} | tr , _).json > $S/modes_$(echo ${spec%%:*} | tr , _).log 2>&1
    grep -hE "^\| (snap|comp)|rror" $S/modes_$(echo ${spec%%:*} | tr , _).log | cut -c1-120
  done
  PYTHONPATH=$PWD timeout -k 5 90 python3 tools/trace_call.py --prefill --mode=snapshot \
    --batch=1 --rows=37 --calls=2 --steps=3 --show=60 > $S/ptrace_r37.log 2>&1
  grep -vE "^[IW]1|Warn" $S/ptrace_r37.log | grep -A12 "per call"
  ;;
c7)
  nvidia-smi --query-gpu=name --format=csv,noheader
  for R in 4096 2048; do
    for t in out_rows=64 out_rows=128:out_warps=8; do
      n=trace_r${R}_$(echo $t | tr ':=' '_-')
      PYTHONPATH=$PWD timeout -k 5 60 python3 tools/trace_call.py --prefill --mode=snapshot \
        --batch=1 --rows=$R --calls=2 --steps=3 --show=60 --chunk_tiles=$V:$t > $S/$n.log 2>&1
      echo "R=$R $t"; grep -vE "^[IW]1|Warn" $S/$n.log | grep -A12 "per call"
    done
  done
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    for R in ${SWEEP:-4096 2048 512}; do T=60 sweep tiles_r$R $R $V:out_rows=128:out_warps=8; done
  fi
  [ "${NCU:-1}" = 0 ] && exit 0
  T=m2v_jax/kernels/tiles.py
  cp $T $S/tiles.py.orig
  for t in table "out_rows=128, out_warps=8"; do
    cp $S/tiles.py.orig $T
    if [ "$t" != table ]; then
      sed -i "s/chunk=128, out_rows=64,/chunk=128, $t,/" $T
      grep -q "chunk=128, $t," $T || { echo "sed failed"; cp $S/tiles.py.orig $T; exit 1; }
    fi
    n=$(echo "$t" | tr -dc 'a-z0-9_')
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,\
launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,\
dram__bytes.sum,lts__t_bytes.sum,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=2048 --calls=1 \
      > $S/ncu_$n.log 2>&1
    echo "ncu $t"; grep -vE "^I1|WARN" $S/ncu_$n.log | grep -E "m2v|  [a-z]" | tail -10
  done
  cp $S/tiles.py.orig $T && rm $S/tiles.py.orig
  ;;
n1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  VS=$V:out_rows=64:scratch_mb=50,$V:out_rows=128:out_warps=8,$V:out_rows=128:out_warps=8:scratch_mb=50
  for turn in plain dt0; do
    [ $turn = dt0 ] && { patch -p1 < $D/dt0_always.patch > /dev/null || exit 1; }
    T=80 sweep seg_$turn 2048 $VS
    [ $turn = dt0 ] && patch -p1 -R < $D/dt0_always.patch > /dev/null
  done
  T=m2v_jax/kernels/tiles.py
  cp $T $S/tiles.py.orig
  for mb in 100.0 50.0; do
    for t in table 128_8; do
      cp $S/tiles.py.orig $T
      sed -i "s/block_p=64, fused_pass=1, state_stages=3)/block_p=64, fused_pass=1, state_stages=3, scratch_mb=$mb)/" $T
      [ $t = 128_8 ] && sed -i "s/chunk=128, out_rows=64,/chunk=128, out_rows=128, out_warps=8,/" $T
      { grep -q "scratch_mb=$mb)" $T && { [ $t = table ] || grep -q "out_rows=128, out_warps=8," $T; }; } \
        || { echo "sed failed"; cp $S/tiles.py.orig $T; exit 1; }
      PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
        --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,\
sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,dram__bytes.sum,\
lts__t_bytes.sum,lts__t_sector_hit_rate.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
        python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=2048 --calls=1 \
        > $S/ncu_${t}_mb$mb.log 2>&1
      echo "ncu $t scratch_mb=$mb"; grep -vE "^I1|WARN" $S/ncu_${t}_mb$mb.log | grep -E "m2v|  [a-z]" | tail -10
    done
  done
  cp $S/tiles.py.orig $T && rm $S/tiles.py.orig
  ;;
esac

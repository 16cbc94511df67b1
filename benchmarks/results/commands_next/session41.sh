#!/bin/bash
# Session 41's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session41.sh CALL
# Each call runs session40.sh cases into a scratch folder, prints their rows, and packs the logs
# and JSON into $OUT/CALL.tgz (the device returns at most 8 files). Predictions: ../session41/README.md.
#   c1: `once` (one_trip.patch, old/new/old, ncu), then the B=1 benchmark of `dth`
#       (dt_heads.patch; dt over 32 heads a program against 128, 16 and 8), no tests (~7 min).
#   c2: `btiles` (B=8 and 2 serial bodies on 64:8:64 and 32:4:64 against the table's), then
#       float32 activations serial against chunked at B=1 R=40..88 (~6 min).
#   c4: on an H200, session39.sh's h200tree (snapshot trees at B=32) and the B=1 prefill at
#       R=37, 512, 4096; on an H100, that prefill and ncu sections of the chunked prefill's
#       output kernel at R=4096 (~5 min; that ncu crashes the profiled process, as at R=4096
#       in session 39).
#   c5: on an H200, the B=1 prefill by the library's route at R=37, 512, 4096 and the
#       snapshot tree suite at B=32, 16 nodes (150 s); on an H100, ncu metrics of the output
#       kernel at R=512 (~1-4 min).
#   c6: (for session 42) the output kernel with `ChunkTiles.out_state_first=1`, with
#       `out_prefetch=1`, and with both, against the table's: chunk_sweep at R=4096 and 512
#       (B=1, bf16, interleaved), then ncu of the output kernel at R=512 with the table's
#       entry switched to each, and back (~6 min).
set -u
D=$(dirname "$0")
S=/tmp/s41_$1; rm -rf $S; mkdir -p $S
case "$1" in
c1)
  OUT=$S bash $D/session40.sh once
  grep -q dt_heads m2v_jax/kernels/tiles.py || patch -p1 < $D/dt_heads.patch > /dev/null || exit 1
  PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --prefill_batch=1 \
    --lengths=20,37,72,136 --prefill_cases=serial \
    --serial_tiles=32:4:64:dt_heads=128,32:4:64:dt_heads=16,32:4:64:dt_heads=8 \
    --out=$S/dth.json > $S/dth.log 2>&1
  echo dth; grep -hE "^\| snap|rror" $S/dth.log | sort -u | cut -c1-140
  patch -p1 -R < $D/dt_heads.patch > /dev/null
  ;;
c2)
  OUT=$S bash $D/session40.sh btiles
  PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --prefill_batch=1 \
    --lengths=40,56,72,88 --prefill_cases=serial,chunked --dtype=float32 \
    --out=$S/f32.json > $S/f32.log 2>&1
  echo f32; grep -hE "^\| (snap|chunk)|rror" $S/f32.log | cut -c1-120
  ;;
c4)
  nvidia-smi --query-gpu=name --format=csv,noheader
  PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --prefill_batch=1 \
    --lengths=37,512,4096 --prefill_cases=chunked --out=$S/prefill.json > $S/prefill.log 2>&1
  echo prefill; grep -hE "^\| (snap|chunk)|rror" $S/prefill.log | cut -c1-120
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    OUT=$S bash $D/session39.sh h200tree
  else
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 150 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1 \
      > $S/ncu_out.log 2>&1
    grep -E "^  m2v|Duration|Registers|Shared Memory Config|Dynamic Shared|Achieved Occ|Theoretical Occ|Block Limit|Waves|DRAM Through|Memory Through|L2 Hit|L1/TEX Hit|Issued Warp|No Eligible|Warp Cycles Per Issued|Stall|Executed Ipc" $S/ncu_out.log | head -45
  fi
  ;;
c5)
  nvidia-smi --query-gpu=name --format=csv,noheader
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    for spec in 37:serial 512,4096:chunked; do L=${spec%:*} K=${spec#*:}
      PYTHONPATH=$PWD timeout -k 5 60 python3 benchmarks/bench.py --suites=prefill \
        --prefill_batch=1 --lengths=$L --prefill_cases=$K --out=$S/prefill_$K.json \
        > $S/prefill_$K.log 2>&1
      grep -hE "^\| snap.*(pallas|chunked)|rror" $S/prefill_$K.log | cut -c1-120
    done
    source $D/lib.sh; O=$S
    run tree M2V_STAGES=tree M2V_LIMIT_TREE=150 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16"
    rows $S/tree/tree.log
  else
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,\
launch__occupancy_limit_shared_mem,launch__grid_size,launch__shared_mem_per_block_dynamic,\
sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,dram__bytes.sum,\
lts__t_bytes.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_barrier_per_warp_active.pct,\
smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_wait_per_warp_active.pct,\
smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_not_selected_per_warp_active.pct,\
smsp__warp_issue_stalled_selected_per_warp_active.pct,\
l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=512 --calls=1 \
      > $S/ncu_out512.log 2>&1
    echo "ncu rc=$?"; grep -vE "^I1|WARN" $S/ncu_out512.log | grep -E "m2v|  [a-z]" | tail -30
  fi
  ;;
c6)
  V=chunk=128:block_p=64:state_heads=16:state_stages=3:out_rows=64:fused_pass=1
  VS=$V:out_state_first=1,$V:out_prefetch=1,$V:out_state_first=1:out_prefetch=1
  for R in 4096 512; do
    PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=chunk_sweep \
      --chunk_rows=$R --chunk_variants=$VS --out=$S/out_r$R.json > $S/out_r$R.log 2>&1
    echo "R=$R"; grep -hE "^\| |rror" $S/out_r$R.log \
      | sed "s/num_warps.*scratch_mb=100.0/.../"
  done
  T=m2v_jax/kernels/tiles.py
  cp $T $S/tiles.py.orig
  for turn in out_state_first=1 out_prefetch=1 "out_state_first=1, out_prefetch=1" table; do
    cp $S/tiles.py.orig $T
    if [ "$turn" != table ]; then
      sed -i "s/block_p=64, fused_pass=1, state_stages=3)/block_p=64, fused_pass=1, state_stages=3, $turn)/" $T
      grep -q "state_stages=3, $turn)" $T || { echo "sed failed"; exit 1; }
    fi
    n=$(echo "$turn" | tr -dc 'a-z_1')
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,\
sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,dram__bytes.sum,\
lts__t_bytes.sum,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=512 --calls=1 \
      > $S/ncu_$n.log 2>&1
    echo "ncu $turn"; grep -vE "^I1|WARN" $S/ncu_$n.log | grep -E "m2v|  [a-z]" | tail -9
  done
  cmp -s $S/tiles.py.orig $T && echo "tiles.py restored"
  ;;
esac
tar czf ${OUT:-/tmp/out}/$1.tgz -C /tmp s41_$1

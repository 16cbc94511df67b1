#!/bin/bash
# Session 53's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session53.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session53/README.md.
#   hx: "highest" with bfloat16 activations at R=4096, B=1: chunk_sweep of the fused kernel
#       in P tiles of 32 at 8 warps (233 registers, no stack offline) and at 4 warps (255,
#       a 152-byte stack) against the table's (P tiles of 64, 8 warps); then ncu of the
#       table's fused kernel (instructions, registers, issue, stalls).
D=$(dirname "$0")
. $D/lib.sh   # sweep, run, rows
HI=chunk=64:block_p=64:num_warps=4:num_stages=1:local_block_p=64:state_warps=8:state_heads=16:state_stages=1:out_warps=4:out_heads=1:out_stages=1:conv_rows=32:conv_cols=256:conv_warps=4:out_rows=64:fused_pass=1:scratch_mb=100.0:out_cols=64:out_acum=0:fused_y=1   # the table's
HI32=${HI/block_p=64/block_p=32}; HI32W4=${HI32/state_warps=8/state_warps=4}
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s53_$s; rm -rf $S; mkdir -p $S
  case $s in
  hx)
    ( trap "tar czf ${OUT:-/tmp/out}/hx.tgz -C /tmp s53_hx" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      PREC="--prefill_precision=highest" T=${HX_SWEEP_S:-240} sweep $S hi4096 4096 "$HI32,$HI32W4"
      PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu \
        --clock-control none --kernel-name regex:m2v_chunk_fused --launch-skip 0 \
        --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,sm__inst_executed.sum,dram__bytes.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,\
launch__occupancy_limit_registers,smsp__warp_issue_stalled_barrier_per_warp_active.pct,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_wait_per_warp_active.pct,\
smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
        python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 \
        --precision=highest --calls=1 > $S/ncu_hi4096.log 2>&1
      echo "ncu hi4096"; grep -vE "^I1|WARN" $S/ncu_hi4096.log | grep -E "m2v|  [a-z]|rror" | tail -18 )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

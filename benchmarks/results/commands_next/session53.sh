#!/bin/bash
# Session 53's calls, from the repository root on HEAD:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session53.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session53/README.md.
#   hx: "highest" with bfloat16 activations at R=4096, B=1: chunk_sweep of the fused kernel
#       in P tiles of 32 at 8 warps (233 registers, no stack offline) and at 4 warps (255,
#       a 152-byte stack) against the table's (P tiles of 64, 8 warps); then ncu of the
#       table's fused kernel (instructions, registers, issue, stalls). Ran in session 53 (the
#       ncu command then inline; now `lib.sh`'s ncu_k with the same flags and metrics).
#   ht: (not yet run) "highest" with bfloat16 activations against the serial path with the
#       table's P tiles of 32 in 4 warps: the ties at B=1 (R=168-360) and B=8 (R=232-472),
#       then ncu of the fused kernel at R=4096.
D=$(dirname "$0")
. $D/lib.sh   # sweep, ncu_k
HI=chunk=64:block_p=64:num_warps=4:num_stages=1:local_block_p=64:state_warps=8:state_heads=16:state_stages=1:out_warps=4:out_heads=1:out_stages=1:conv_rows=32:conv_cols=256:conv_warps=4:out_rows=64:fused_pass=1:scratch_mb=100.0:out_cols=64:out_acum=0:fused_y=1   # the table's then (P64, 8 warps)
HI32=${HI/block_p=64/block_p=32}; HI32W4=${HI32/state_warps=8/state_warps=4}
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  S=/tmp/s53_$s; rm -rf $S; mkdir -p $S
  case $s in
  hx)
    ( trap "tar czf ${OUT:-/tmp/out}/hx.tgz -C /tmp s53_hx" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      PREC="--prefill_precision=highest" T=${HX_SWEEP_S:-240} sweep $S hi4096 4096 "$HI32,$HI32W4"
      NCU_S=120 PROFILE_ARGS=--precision=highest NCU_MORE=",\
smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,\
smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
        ncu_k $S hi4096 m2v_chunk_fused 4096 )
    ;;
  ht)
    ( trap "tar czf ${OUT:-/tmp/out}/ht.tgz -C /tmp s53_ht" EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader | tee $S/card.txt
      for spec in 1:168,232,296,360 8:232,296,360,472; do
        PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill \
          --prefill_batch=${spec%%:*} --lengths=${spec#*:} --prefill_cases=serial,highest \
          --out=$S/ht_b${spec%%:*}.json > $S/ht_b${spec%%:*}.log 2>&1
        grep -hE "^\| (snap|comp)|rror" $S/ht_b${spec%%:*}.log | cut -c1-110
      done
      NCU_S=120 PROFILE_ARGS=--precision=highest ncu_k $S hi4096 m2v_chunk_fused 4096 )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"

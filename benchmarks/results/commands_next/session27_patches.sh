#!/bin/bash
# For a later session: prefill kernel patches prepared in session 26 (interpret tests pass;
# not measured), each against the tree in turn twice at R=512/4096 (B=1, bf16, snapshot),
# then ncu of the kernels it changes (at R=4096 the first of the call's two segments, 16 of
# its 32 chunks; rebased in sessions 27-28 onto the segmented scan). Run from the repository
# root, patches not applied:
#   bash benchmarks/results/commands_next/session27_patches.sh fused_prefetch cb_in_output
# - fused_prefetch: the fused chunk-states pass loads each chunk's x and dt one chunk ahead by
#   hand (the same products and sums; upstream Triton 215 -> 252 registers, which at B=1's one
#   program per SM costs no occupancy). Session 26's call 1 found a third of the pass's stall
#   samples on the barrier at the top of its chunk loop, waiting on the chunk's loads.
# - cb_in_output: at bf16 products the output kernel computes each C·Bᵀ block itself (C·Bᵀ,
#   then the decay weights on it, then the product with x: the flash-attention pattern), so
#   the C·Bᵀ launch (12.8 µs at R=4096) and its 17.3 MB of scratch go, and the B and x blocks
#   are both direct product operands (pipelinable at out_stages 2). Upstream Triton 197 ->
#   235 registers: the risk is the output kernel's 128.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_next
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for p in "$@"; do
  for i in 1 2; do
    for v in new base; do
      [ $v = new ] && patch -s -p1 < $D/$p.patch
      echo "=== $p $v $i $(date -u +%T)"
      timeout -k 5 70 python3 benchmarks/bench.py --suites=prefill --prefill_cases=chunked \
        --lengths=512,4096 --out=$O/${p}_prefill_${v}_$i.json 2>&1 | grep -E "^\||Error" | tail -3 \
        | tee $O/${p}_prefill_${v}_$i.txt
      [ $v = new ] && patch -s -R -p1 < $D/$p.patch
    done
  done
  patch -s -p1 < $D/$p.patch
  n=3; [ $p = cb_in_output ] && n=2        # the matched launches of one call's segment
  echo "=== $p ncu $(date -u +%T)"      # the second call's first segment (two a call)
  timeout -k 5 60 ncu --clock-control none --kernel-name regex:'m2v_chunk_(states_pass|cb|out)_snapshot_seg' \
    --launch-skip $((2 * n)) --launch-count $n --metrics $M python3 tools/profile_call.py --prefill \
    --mode=snapshot --batch=1 --rows=4096 --calls=1 2>&1 | grep -E "m2v_|  [a-z_]+__" \
    | sed 's/  */ /g' | tee $O/${p}_ncu.txt
  patch -s -R -p1 < $D/$p.patch
done
git status --short m2v_jax

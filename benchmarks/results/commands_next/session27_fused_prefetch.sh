#!/bin/bash
# For a later session: the fused chunk-states pass with each chunk's x and dt loaded one chunk
# ahead by hand (fused_prefetch.patch; the same products and sums, so bitwise the same
# results), against the tree, in turn twice; ncu of the fused pass with the patch. Session 26
# found a third of its stall samples on one barrier at the top of the chunk loop, waiting on
# the chunk's loads (benchmarks/results/session26/README.md, call 1). At B=1 there is one
# program per SM, so registers up to ~250 cost no occupancy (upstream Triton: 215 -> 252).
# Run from the repository root with the patch not applied.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_next
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
for i in 1 2; do
  for v in new base; do
    [ $v = new ] && patch -s -p1 < $D/fused_prefetch.patch
    timeout -k 5 70 python3 benchmarks/bench.py --suites=prefill --prefill_cases=chunked \
      --lengths=512,4096 --out=$O/prefill_${v}_$i.json 2>&1 | grep -E "^\|" | tail -2 | tee $O/prefill_${v}_$i.txt
    [ $v = new ] && patch -s -R -p1 < $D/fused_prefetch.patch
  done
done
patch -s -p1 < $D/fused_prefetch.patch
timeout -k 5 50 ncu --clock-control none --kernel-name regex:m2v_chunk_states_pass --launch-skip 1 \
  --launch-count 1 --metrics $M python3 tools/profile_call.py --prefill --mode=snapshot \
  --batch=1 --rows=4096 --calls=1 2>&1 | grep -E "  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_new.txt
patch -s -R -p1 < $D/fused_prefetch.patch

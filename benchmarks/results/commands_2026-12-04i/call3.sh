#!/bin/bash
# Session 26, call 3: two variants of the factored decay against the per-element exp (the tree
# before this session), in turn: A = the factors only, no per-element path (not safe past a
# log-decay range of ~170 in a block; the bench's inputs stay under 80), v on C·Bᵀ's
# columns; B = call 2's lax.cond with v on C·Bᵀ's columns instead of on x. Prefill R=512/4096
# and ncu of the output kernel for each. The call ran with chunk_scan_{factored_only,base,
# cond_v_on_cb}.py beside this script: the first and last are kept as factored_only.patch and
# cond_v_on_cb.patch against the base, which is m2v_jax/kernels/chunk_scan.py at dd058ae.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_2026-12-04i
K=m2v_jax/kernels/chunk_scan.py
cat .tree 2>/dev/null | tee $O/tree.txt
cp $K $O/tree_chunk_scan.py
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for v in factored_only base cond_v_on_cb; do
  cp $D/chunk_scan_$v.py $K
  echo "=== prefill $v $(date -u +%T)"
  timeout -k 5 80 python3 benchmarks/bench.py --suites=prefill --prefill_cases=chunked \
    --lengths=512,4096 --out=$O/prefill_$v.json 2>&1 | grep -E "^\|" | tail -2 | tee $O/prefill_$v.txt
  echo "=== ncu $v $(date -u +%T)"
  timeout -k 5 50 ncu --clock-control none --kernel-name regex:m2v_chunk_out --launch-skip 1 \
    --launch-count 1 --metrics $M python3 tools/profile_call.py --prefill --mode=snapshot \
    --batch=1 --rows=4096 --calls=1 2>&1 | grep -E "  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_$v.txt
done
cp $O/tree_chunk_scan.py $K
date -u

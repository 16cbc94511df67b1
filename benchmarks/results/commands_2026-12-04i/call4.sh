#!/bin/bash
# Session 26, call 4: each slot's cumulative dt computed once by XLA before the chunk kernels
# (dt_cumsum.patch, applied in the tree), so that the fused pass and the output kernel load
# acum instead of summing and scanning dt in every program (and in every chunk of the fused
# pass's chain); against the tree before, in turn twice. Then the GPU tests of the prefill
# paths on the faster of the two (the patch is kept if R=4096 is at least 1% faster).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_2026-12-04i
cat .tree 2>/dev/null | tee $O/tree.txt
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for i in 1 2; do
  for v in new base; do
    [ $v = base ] && patch -s -R -p1 < $D/dt_cumsum.patch
    echo "=== prefill $v $i $(date -u +%T)"
    timeout -k 5 70 python3 benchmarks/bench.py --suites=prefill --prefill_cases=chunked \
      --lengths=512,4096 --out=$O/prefill_${v}_$i.json 2>&1 | grep -E "^\|" | tail -2 | tee $O/prefill_${v}_$i.txt
    [ $v = base ] && patch -s -p1 < $D/dt_cumsum.patch
  done
done
echo "=== ncu new $(date -u +%T)"
timeout -k 5 50 ncu --clock-control none --kernel-name regex:'m2v_chunk_(out|states_pass)' \
  --launch-skip 2 --launch-count 2 --metrics $M python3 tools/profile_call.py --prefill \
  --mode=snapshot --batch=1 --rows=4096 --calls=1 2>&1 | grep -E "m2v_|  [a-z_]+__" \
  | sed 's/  */ /g' | tee $O/ncu_new.txt
keep=$(python3 - $O <<'PY'
import json, sys, statistics
o = sys.argv[1]
t = {v: [next(r["median_us"] for r in json.load(open(f"{o}/prefill_{v}_{i}.json"))["prefill"]
              if "R=4096" in r["name"]) for i in (1, 2)] for v in ("new", "base")}
print(int(statistics.mean(t["new"]) < 0.99 * statistics.mean(t["base"])))
PY
)
echo "keep the patch: $keep"
if [ "$keep" = 1 ]; then K="prefill or packed or chunk"; else patch -s -R -p1 < $D/dt_cumsum.patch; K="extreme_decays"; fi
grep -c "dcs_ref" m2v_jax/kernels/chunk_scan.py
echo "=== gpu tests -k '$K' $(date -u +%T)"
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=170 M2V_GPU_TESTS_K="$K" \
  OUT=$O timeout -k 10 185 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
date -u

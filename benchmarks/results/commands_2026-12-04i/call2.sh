#!/bin/bash
# Session 26, call 2: the output kernel's decay as row and column factors (decay_split.patch,
# applied in the tree) against the per-element exp (the patch reversed): the chunked prefill
# at R=512/4096 in turn twice ("highest" at R=4096 in the first round); the precision tool
# and ncu on the output kernel with the patch; then the GPU tests of the prefill paths.
# (A first run of this call, with the packed suite and more, lost its machine mid-call.)
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_2026-12-04i
cat .tree 2>/dev/null | tee $O/tree.txt
date -u
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active
for i in 1 2; do
  for v in new base; do
    [ $v = base ] && patch -s -R -p1 < $D/decay_split.patch
    cases=chunked; [ $i = 1 ] && cases=chunked,highest
    echo "=== prefill $v $i $(date -u +%T)"
    timeout -k 5 100 python3 benchmarks/bench.py --suites=prefill --prefill_cases=$cases \
      --lengths=512,4096 --out=$O/prefill_${v}_$i.json 2>&1 | grep -E "^\|" | tee $O/prefill_${v}_$i.txt
    [ $v = base ] && patch -s -p1 < $D/decay_split.patch
  done
done
grep -c "DECAY_SPLIT" m2v_jax/kernels/chunk_scan.py
echo "=== ncu $(date -u +%T)"
timeout -k 5 60 ncu --clock-control none --kernel-name regex:m2v_chunk_out --launch-skip 1 \
  --launch-count 1 --metrics $M python3 tools/profile_call.py --prefill --mode=snapshot \
  --batch=1 --rows=4096 --calls=1 2>&1 | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_new.txt
echo "=== precision $(date -u +%T)"
timeout -k 5 90 python3 tools/prefill_precision_error.py --lengths=4096 \
  --out=$O/precision_new.json 2>&1 | tail -12 | tee $O/precision_new.txt
echo "=== gpu tests $(date -u +%T)"
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=170 M2V_GPU_TESTS_K="prefill or packed or chunk" \
  OUT=$O timeout -k 10 185 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
date -u

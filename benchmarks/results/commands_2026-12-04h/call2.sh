#!/bin/bash
# Session 25, call 2: C·Bᵀ stored in bfloat16 at "bf16" products (cb_bf16.patch, applied in
# the tree) against float32: the chunked prefill at R=37/512/4096 in turn twice, the precision
# tool at R=4096 (bf16 activations), ncu on the chunked kernels at R=4096; then the GPU tests
# of the prefill paths on the patched tree.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_2026-12-04h
cat .tree 2>/dev/null | tee $O/tree.txt
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum
for i in 1 2; do
  for v in new base; do
    [ $v = base ] && patch -s -R -p1 < $D/cb_bf16.patch
    timeout -k 5 100 python3 benchmarks/bench.py --suites=prefill --prefill_cases=chunked \
      --lengths=37,512,4096 --out=$O/prefill_${v}_$i.json 2>&1 | grep -E "^\|" | tee $O/prefill_${v}_$i.txt
    if [ $i = 1 ]; then
      timeout -k 5 100 python3 tools/prefill_precision_error.py --lengths=4096 --dtypes=bfloat16 \
        --out=$O/precision_$v.json 2>&1 | tail -8 | tee $O/precision_$v.txt
      timeout -k 5 80 ncu --clock-control none --kernel-name regex:m2v_chunk --launch-skip 4 \
        --launch-count 4 --metrics $M python3 tools/profile_call.py --prefill --mode=snapshot \
        --batch=1 --rows=4096 --calls=1 2>&1 | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' \
        | tee $O/ncu_$v.txt
    fi
    [ $v = base ] && patch -s -p1 < $D/cb_bf16.patch
  done
done
grep -c "cb_dtype" m2v_jax/kernels/chunk_scan.py
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=170 M2V_GPU_TESTS_K="prefill or packed or chunk or state_dtype" \
  OUT=$O timeout -k 10 185 bash tools/run_gpu.sh 2>&1 | grep -E "passed|failed|Error" | tail -5
date -u

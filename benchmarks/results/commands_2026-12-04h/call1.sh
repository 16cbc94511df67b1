#!/bin/bash
# Session 25, call 1: out_proj's product in the activation dtype (layer.mixer) against the
# float32 product and a cast, the model benchmark at B=32 in turn twice; then the GPU suite
# on this tree (the example's test now runs the reference decoder on the CPU).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
cat .tree 2>/dev/null | tee $O/tree.txt
NEW='project(g, params.out_proj, out_dtype)'; OLD='project(g, params.out_proj)'
for i in 1 2; do
  for v in new base; do
    [ $v = base ] && sed -i "s/$NEW/$OLD/" m2v_jax/layer.py
    timeout -k 5 150 python3 benchmarks/model_bench.py --batches=32 --out=$O/model_${v}_$i.json \
      2>&1 | grep -E "^\||tokens|equal|modes" | tee $O/model_${v}_$i.txt
    [ $v = base ] && sed -i "s/$OLD/$NEW/" m2v_jax/layer.py
  done
done
grep -c "out_proj, out_dtype" m2v_jax/layer.py
M2V_STAGES=gpu_tests M2V_LIMIT_GPU_TESTS=420 OUT=$O timeout -k 10 440 bash tools/run_gpu.sh 2>&1 | tail -12
date -u

#!/bin/bash
# Session 24, call 4: in_proj rounded to the activation dtype in the GEMM (project_bf16.patch,
# applied in the tree) against the float32 GEMM and a convert: bitwise on the H200, then the
# model benchmark at B=32, patched and reverted in turn, twice.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_2026-12-04g
timeout -k 5 120 python3 $D/project_bitwise.py 2>&1 | grep rows | tee $O/project_bitwise.txt
for i in 1 2; do
  for v in patched base; do
    [ $v = base ] && patch -s -R -p1 < $D/project_bf16.patch
    timeout -k 5 150 python3 benchmarks/model_bench.py --batches=32 --out=$O/model_${v}_$i.json \
      2>&1 | grep -E "^\||tokens|equal|modes" | tee $O/model_${v}_$i.txt
    [ $v = base ] && patch -s -p1 < $D/project_bf16.patch
  done
done
grep -c "preferred_element_type=out" m2v_jax/layer.py
date -u

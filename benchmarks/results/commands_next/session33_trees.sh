#!/bin/bash
# Prepared in session 32, two calls of ~5 minutes. From the repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session33_trees.sh call1
#     the compact fold's path walk against 33cdd5d's fold (ncu, B=32, R=8, one launch each,
#     interleaved; needs old_code/ = `git archive 33cdd5d m2v_jax tools` carried beside the
#     working tree), the loop suite, and the tree suite at B=1-128 in both modes;
#   OUT=/tmp/out bash benchmarks/results/commands_next/session33_trees.sh call2
#     trees in both modes with other tiles and (snapshot) with the parents' slots loaded a
#     row ahead (`TileConfig.tree_prefetch`), against the table's tiles, at B=32 and 128.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false
case ${1:-call1} in
  call1)
    N=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread
    for v in new old new old; do
      if [ $v = old ]; then P=old_code; else P=.; fi
      echo "=== ncu $v"
      PYTHONPATH=$P timeout 70 ncu --clock-control none --kernel-name regex:m2v_ssm \
        --launch-skip 1 --launch-count 1 --metrics $N python3 $P/tools/profile_call.py \
        --mode=compact --batch=32 --calls=1 2>&1 | grep -E "gpu__time|inst_exec|registers"
    done
    M2V_STAGES="loop tree" M2V_LIMIT_LOOP=150 M2V_LIMIT_TREE=280 OUT=$O/suites \
      M2V_BENCH_ARGS="--state_dtypes=float32,bfloat16" bash tools/run_gpu.sh 2>&1 | grep -E "^===|^\| (snap|comp)|rror" | cut -c1-160 ;;
  call2)
    M2V_STAGES="tree" M2V_LIMIT_TREE=480 OUT=$O/tiles M2V_BENCH_ARGS="--batches=32,128 \
--tree_tiles=32:4:64,32:4:64:tree_prefetch=1,64:4:64:tree_prefetch=1" \
      bash tools/run_gpu.sh 2>&1 | grep -E "^===|^\| (snap|comp).*tree|rror" | cut -c1-200 ;;
esac

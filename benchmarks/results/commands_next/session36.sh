#!/bin/bash
# Session 36, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session36.sh CALL
# Stages of tools/run_gpu.sh, each run in its own folder under $OUT.
#   goal:  on an H200 (the tree issue's goals are stated for it): the tree suite at B=32 in
#          both modes, uniform and breadth-first trees; the snapshot trees' variant
#          tree_y_after=1 against the table's (the root's row peeled, not yet timed on the
#          H200); then ncu of the snapshot chain's and tree's launches at R=16 (~9 min).
#   suite: the whole GPU suite with 16 workers and 560 s (the call's limit is 600).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
run() {  # run FOLDER VAR=VALUE...: tools/run_gpu.sh with those settings, its output in FOLDER
  local dir=$O/$1; shift
  env "$@" OUT=$dir bash tools/run_gpu.sh > $dir.txt 2>&1
  echo "$dir: exit $?"
}
rows() {  # the benchmark rows of a run's log, the table's tile fields left out
  grep -hE "^\| (snap|comp)|rror" $1 | sort -u \
    | sed 's/num_warps=4 num_stages=1 n_cols=64 block_c=128 prep_warps=4 //' | cut -c1-220
}
case "${1:-goal}" in
goal)
  run goal M2V_STAGES=tree M2V_LIMIT_TREE=250 \
    M2V_BENCH_ARGS="--batches=32 --tree_shapes=uniform,bfs"
  rows $O/goal/tree.log
  run y_after M2V_STAGES=tree M2V_LIMIT_TREE=150 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16 --tree_tiles=64:4:64:tree_y_after=1"
  rows $O/y_after/tree.log
  for tree in chain tree; do
    run ncu_$tree M2V_STAGES=ncu M2V_NCU_MODES=snapshot M2V_LIMIT_NCU_SNAPSHOT=60 \
      M2V_PROFILE_ARGS="--rows=16 --capacity=16$([ $tree = tree ] && echo ' --tree')"
    grep -E "m2v_|gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_$tree/ncu_snapshot.log \
      | sed -E 's/ +/ /g' | cut -c1-90
  done
  ;;
suite)
  run suite M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-560}
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/suite.txt | tail -25
  ;;
esac

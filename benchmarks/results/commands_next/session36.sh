#!/bin/bash
# Session 36, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session36.sh CALL
# Stages of tools/run_gpu.sh, each run in its own folder under $OUT. The tree_y_launch variants
# need `git apply benchmarks/results/commands_next/tree_y_launch.patch` first (the code that
# ran; removed after session 36's call 3).
#   goal:  on an H200 (the tree issue's goals are stated for it): the tree suite at B=32 in
#          both modes, uniform and breadth-first trees; the snapshot trees' variant
#          tree_y_after=1 against the table's (the root's row peeled, not yet timed on the
#          H200) and tree_y_launch=64 (y in a launch of its own), with the compiled HLO's
#          copies (~9 min).
#   ncu:   ncu of the snapshot chain's and tree's launches at R=16, and of the tree's with
#          tree_y_launch=64 (~4 min).
#   ylaunch: tree_y_launch's y launch in P tiles of 16, 32 and 64 rows, timed against one
#          launch, ncu of 16 and 32, and the compiled test that holds the variants bitwise
#          to one launch (~7 min).
#   (the whole GPU suite: session37.sh suite)
set -u
source "$(dirname "$0")/lib.sh"
copies() {  # the copies in the compiled HLO of a B=32, R=16 snapshot tree call with tree_y_launch
  PYTHONPATH=$PWD timeout 120 python3 - > $1 2>&1 <<'PY'
import re
import jax, jax.numpy as jnp
from m2v_jax import config as config_lib, dispatch
from m2v_jax.kernels import tiles as tiles_lib
cfg = config_lib.BOLT.replace(replay_mode="snapshot", capacity=16)
tiles = tiles_lib.tile_config(cfg, 32).replace_from_text("64:4:64:tree_y_launch=64")
f = lambda p, s, a, par: dispatch.kernel_call(cfg, config_lib.PALLAS, p, s, a, tiles, parents=par)
args = dispatch.abstract_call_args(cfg, 32, 16) + (jax.ShapeDtypeStruct((32, 16), jnp.int32),)
text = jax.jit(f, donate_argnums=(1,)).lower(*args).compile().as_text()
print("copy ops:", [l.strip()[:160] for l in text.splitlines() if re.search(r"= \S+ copy\(", l)])
print("custom calls:", len(re.findall(r"custom-call\(", text)))
PY
  cat $1
}
case "${1:-goal}" in
goal)
  run goal M2V_STAGES=tree M2V_LIMIT_TREE=230 \
    M2V_BENCH_ARGS="--batches=32 --tree_shapes=uniform,bfs"
  rows $O/goal/tree.log
  run y_after M2V_STAGES=tree M2V_LIMIT_TREE=240 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16 --tree_tiles=64:4:64:tree_y_after=1,64:4:64:tree_y_launch=64,32:4:64:tree_y_launch=32"
  rows $O/y_after/tree.log
  copies $O/copies.txt
  ;;
ncu)
  for tree in chain tree; do
    run ncu_$tree M2V_STAGES=ncu M2V_NCU_MODES=snapshot M2V_LIMIT_NCU_SNAPSHOT=60 \
      M2V_PROFILE_ARGS="--rows=16 --capacity=16$([ $tree = tree ] && echo ' --tree')"
    grep -E "m2v_|gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_$tree/ncu_snapshot.log \
      | sed -E 's/ +/ /g' | cut -c1-90
  done
  run ncu_y_launch M2V_STAGES=ncu M2V_NCU_MODES=snapshot M2V_LIMIT_NCU_SNAPSHOT=60 \
    M2V_NCU_SKIP=3 M2V_NCU_COUNT=3 \
    M2V_PROFILE_ARGS="--rows=16 --capacity=16 --tree --tiles=64:4:64:tree_y_launch=64"
  grep -E "m2v_|gpu__time|inst_exec|registers|warps_active|dram" \
    $O/ncu_y_launch/ncu_snapshot.log | sed -E 's/ +/ /g' | cut -c1-90
  ;;
ylaunch)  # the y launch's P tile: the three against one launch, then ncu of 16 and 32
  run ylaunch M2V_STAGES=tree M2V_LIMIT_TREE=240 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16 --tree_tiles=64:4:64:tree_y_launch=16,64:4:64:tree_y_launch=32,\
64:4:64:tree_y_launch=64"
  rows $O/ylaunch/tree.log
  for y in 16 32; do
    run ncu_y$y M2V_STAGES=ncu M2V_NCU_MODES=snapshot M2V_LIMIT_NCU_SNAPSHOT=60 \
      M2V_NCU_SKIP=3 M2V_NCU_COUNT=3 \
      M2V_PROFILE_ARGS="--rows=16 --capacity=16 --tree --tiles=64:4:64:tree_y_launch=$y"
    grep -E "m2v_|gpu__time|inst_exec|registers|warps_active|dram" \
      $O/ncu_y$y/ncu_snapshot.log | sed -E 's/ +/ /g' | cut -c1-90
  done
  run ytest M2V_STAGES=gpu_tests M2V_GPU_TESTS_K="refolded_or_reloaded" M2V_LIMIT_GPU_TESTS=180
  grep -E "passed|failed|FAILED|Error" $O/ytest.txt | tail -5
  ;;
esac

#!/bin/bash
# Session 37's device calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session37.sh CALL
# Stages of tools/run_gpu.sh (or bench.py), each in its own folder under $OUT.
#   goal:   on an H200 (the tree issue's goals are stated for it): the tree suite at B=32 in
#           both modes, uniform and breadth-first trees, then tree_y_after=1 against the
#           table (~6 min). The root's row peel has not yet been timed on an H200.
#   body:   `TileConfig.body_rows` (the serial path's body folded one product a segment of 8,
#           16 or 32 rows) against the table and the chunked path at R=37..512, B=1, bf16,
#           and its compiled test (~6 min).
#   first:  goal on an H200, body on any other card.
#   (Its stages and evict cases moved to session38.sh.)
#   suite:  the whole GPU suite with 16 workers and 560 s (the call's limit is 600).
set -u
source "$(dirname "$0")/lib.sh"
CASE=${1:-goal}
if [ "$CASE" = first ]; then  # goal on an H200, body on any other card
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && CASE=goal || CASE=body
  echo "first: $CASE"
fi
case "$CASE" in
goal)
  run goal M2V_STAGES=tree M2V_LIMIT_TREE=230 \
    M2V_BENCH_ARGS="--batches=32 --tree_shapes=uniform,bfs"
  rows $O/goal/tree.log
  run y_after M2V_STAGES=tree M2V_LIMIT_TREE=150 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16 --tree_tiles=64:4:64:tree_y_after=1"
  rows $O/y_after/tree.log
  ;;
body)  # TileConfig.body_rows: the serial path's body folded in products, against the table
  run body M2V_STAGES="gpu_tests prefill" M2V_GPU_TESTS_K="body_rows" M2V_LIMIT_GPU_TESTS=150 \
    M2V_LIMIT_PREFILL=300 M2V_BENCH_ARGS="--lengths=37,72,136,264,512 \
--prefill_cases=serial,chunked --serial_tiles=64:4:64:body_rows=8,64:4:64:body_rows=16,\
64:4:64:body_rows=32"
  grep -E "passed|failed" $O/body/gpu_tests.log | tail -2
  rows $O/body/prefill.log
  ;;
body2)  # body_rows 32 (the default now) and 64 at other tiles, the f32 chunked path, ncu at R=37
  run body2 M2V_STAGES=prefill M2V_LIMIT_PREFILL=260 M2V_BENCH_ARGS="--lengths=37,72,136,200,264,512 \
--prefill_cases=serial,chunked,highest --serial_tiles=64:4:64:body_rows=0,64:4:64:body_rows=64,\
64:8:64:body_rows=32,64:8:64:body_rows=64,32:4:64:body_rows=32"
  rows $O/body2/prefill.log
  run ncu37 M2V_STAGES=ncu M2V_NCU_MODES=snapshot M2V_LIMIT_NCU_SNAPSHOT=120 \
    M2V_PROFILE_ARGS="--batch=1 --rows=37 --prefill --nochunked"
  grep -E "m2v_|gpu__time|inst_exec|registers_per|warps_active|issue_active|dram__" \
    $O/ncu37/ncu_snapshot.log | head -40
  ;;
suite)
  run suite M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-560}
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/suite.txt | tail -25
  ;;
esac

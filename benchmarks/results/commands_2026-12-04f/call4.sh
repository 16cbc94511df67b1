#!/bin/bash
# Session 23, call 4 (2026-12-04): the sanitizer stage (small geometry, four tools) and the
# model benchmark at B=32, on the committed tree.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H' | tee $O/commit.txt
M2V_STAGES="sanitizer model" M2V_MODEL_ARGS="--batches=32" M2V_LIMIT_MODEL=200 OUT=$O \
  timeout -k 10 560 bash tools/run_gpu.sh 2>&1 | grep -E "^===|ERROR SUMMARY|tokens|modes equal|^\|" | tail -40
date -u

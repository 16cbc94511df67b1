#!/bin/bash
# 2026-12-04 (session 22), call 3: the whole GPU suite and the sanitizer stage on main with
# the 16-bit state changes (state_one_pass + fold_round_cond, committed).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H' | tee $O/commit.txt
M2V_STAGES="gpu_tests sanitizer" M2V_LIMIT_GPU_TESTS=330 M2V_LIMIT_SANITIZER=230 OUT=$O \
  timeout -k 10 580 bash tools/run_gpu.sh 2>&1 | tail -12
date -u

#!/bin/bash
# Next session, call 2 (branch mgpu-port): the loop suite (acceptance mix, rotating banks, conv
# included) with the Mosaic GPU launch, B=1/8/32/128, W=32 too; ncu of its kernels at B=32.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M2V_STAGES="loop ncu" M2V_LIMIT_LOOP=330 \
  M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32" \
  M2V_PROFILE_ARGS="--tiles=64:4:64:mosaic=1" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | tail -60

#!/bin/bash
# Next session, call 2: the loop suite with the Mosaic GPU launch (acceptance mix, conv included,
# rotating banks), B=1/8/32/128, compact default and W=32, snapshot.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M2V_STAGES="loop" M2V_LIMIT_LOOP=520 M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32 --vary_batches=" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "^|\|exit" | tail -24

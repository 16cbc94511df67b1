#!/bin/bash
# Session 43's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session43.sh CALL
# Outputs go to /tmp/s43_CALL and are packed into $OUT/CALL.tgz (also when a case stops early).
# Predictions: ../session43/README.md.
#   t1: B=1 bf16 snapshot prefill timelines (per kernel, one prefill a step) at R=37, 512 and
#       4096, with XLA's optimized HLO of each step dumped (the fusions' names in the timeline
#       are the HLO's), to find what the small XLA kernels around the Pallas launches compute.
set -u
S=/tmp/s43_$1; rm -rf $S; mkdir -p $S
trap 'tar czf ${OUT:-/tmp/out}/$1.tgz -C /tmp s43_$1' EXIT
case "$1" in
t1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  for R in 37 512 4096; do
    mkdir -p $S/hlo_r$R
    XLA_FLAGS="--xla_dump_to=$S/hlo_r$R --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE_XX" \
      PYTHONPATH=$PWD timeout -k 5 90 python3 tools/trace_call.py --prefill --mode=snapshot \
      --batch=1 --rows=$R --calls=1 --steps=3 --show=80 > $S/trace_r$R.log 2>&1
    find $S/hlo_r$R -type f ! -name '*after_optimizations.txt' -delete
    echo "R=$R"; grep -E "^\||per call" $S/trace_r$R.log | cut -c1-100
  done
  ;;
esac

#!/bin/bash
# Session 43's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session43.sh CALL
# Outputs go to /tmp/s43_CALL and are packed into $OUT/CALL.tgz (also when a case stops early).
# Predictions: ../session43/README.md.
#   t1: B=1 bf16 snapshot prefill timelines (per kernel, one prefill a step) at R=37, 512 and
#       4096, with XLA's optimized HLO of each step dumped (the fusions' names in the timeline
#       are the HLO's), to find what the small XLA kernels around the Pallas launches compute;
#       then the chunked prefill at R=512 and 4096 with and without `static_slots.patch` (the
#       slot table of a layout the host knows built on the host: the working tree has it),
#       new, old, new, and R=512's timeline without it.
set -u
D=$(dirname "$0")
S=/tmp/s43_$1; rm -rf $S; mkdir -p $S
trap 'tar czf ${OUT:-/tmp/out}/$1.tgz -C /tmp s43_$1' EXIT
trace() {  # trace NAME ROWS: the B=1 bf16 snapshot prefill's timeline, XLA's HLO beside it
  mkdir -p $S/hlo_$1
  XLA_FLAGS="--xla_dump_to=$S/hlo_$1 --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE_XX" \
    PYTHONPATH=$PWD timeout -k 5 90 python3 tools/trace_call.py --prefill --mode=snapshot \
    --batch=1 --rows=$2 --calls=1 --steps=3 --show=80 > $S/trace_$1.log 2>&1
  find $S/hlo_$1 -type f ! -name '*after_optimizations.txt' -delete
  echo "$1"; grep -E "^\||per call" $S/trace_$1.log | cut -c1-100
}
ser() {  # ser NAME: the prefill suite's chunked case, B=1 bf16, R=512 and 4096
  PYTHONPATH=$PWD timeout -k 5 100 python3 benchmarks/bench.py --suites=prefill \
    --prefill_batch=1 --lengths=512,4096 --prefill_cases=chunked --out=$S/$1.json \
    > $S/$1.log 2>&1
  echo "$1"; grep -hE "^\| (snap|chunk)" $S/$1.log | cut -c1-100
}
case "$1" in
t1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  for R in 37 512 4096; do trace r$R $R; done
  ser new
  patch -p1 -R < $D/static_slots.patch > /dev/null || exit 1
  ser old; trace old_r512 512
  patch -p1 < $D/static_slots.patch > /dev/null || exit 1
  ser new2
  ;;
esac

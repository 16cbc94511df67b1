#!/bin/bash
# Session 20, call 2 (2026-12-04): is the loop suite's B=1 time the host's? The loop suite at
# B=1 with 16 calls per dispatch (the default), then 128 calls per dispatch over 16 and 32
# banks (72 and 144 MiB of compact state, past the 60 MB L2); then the prepared P-tile check.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H' | tee $O/commit.txt
for cfg in "8 16" "16 128" "32 128"; do set -- $cfg
  echo "### loop B=1 banks=$1 min_calls=$2" | tee -a $O/loop_b1.txt
  PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=loop --batches=1 \
    --vary_batches= --windows=32 --banks=$1 --min_calls=$2 --blocks=11 --out=$O/loop_b1_banks$1_calls$2.json \
    2>&1 | grep -E "^\|" | tee -a $O/loop_b1.txt
done
timeout -k 5 200 bash benchmarks/results/commands_next/block_p_bitwise.sh
date -u

#!/bin/bash
# 2026-12-04 (session 21), call 3: does XLA copy pool leaves around the verify launches when
# the pool holds more entries than the batch? (The loop suite's pooled B=1 case measured
# 2.7 µs more device time per compact call than 16 separate one-entry pools.)
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H' | tee $O/commit.txt
PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 300 python3 tools/pool_copies.py \
  --cases=compact:1:1,compact:1:16,compact:1:256,snapshot:1:1,snapshot:1:16,compact:8:8,compact:8:256,snapshot:8:256,compact:32:32,compact:32:256 \
  2>&1 | grep -v "^WARNING\|^I0000\|^E0000" | tee $O/pool_copies.txt
date -u

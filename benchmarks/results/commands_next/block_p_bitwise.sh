#!/bin/bash
# Prepared 2026-12-04, not yet run: whether the verify kernels' y and states are bitwise the
# same at P tiles of 16 and 32 (2 warps) as at the table's 64:4:64, compiled, in both modes.
# If they are, the tile table may pick small P tiles at B=1 (measured 0.91x there in compact,
# 2026-12-01) without results depending on the batch size.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
date -u
PYTHONPATH=$PWD timeout -k 5 240 python3 tools/tiles_bitwise.py --tiles=64:4:64,32:2:64,16:2:64 \
  2>&1 | grep -v "^I1\|^W1" | tail -8 | tee $O/block_p_bitwise.log
date -u

#!/bin/bash
# Session 25, call 4: out_proj's bf16 GEMM output against its float32 GEMM + convert, at
# Bolt's out_proj shape (review: session 24 checked in_proj's shape only).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout -k 5 150 python3 benchmarks/results/commands_2026-12-04h/out_proj_bitwise.py 2>&1 | grep rows | tee $O/out_proj_bitwise.txt
date -u

#!/bin/bash
# Session 24, call 3: compile time of the verify and prefill calls on the H200 with and
# without Triton's dialect module registered, in turn, each in a fresh process (no
# persistent compilation cache).
set -u
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
P=benchmarks/results/commands_2026-12-04g/compile_time.py
for i in 1 2; do
  timeout -k 5 120 python3 $P --unregister
  timeout -k 5 120 python3 $P
done
date -u

#!/bin/bash
# For the next session with an H200 (prepared in session 31): what session 31 owes the H200,
# in one call of ~8 minutes. From the repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session32_h200.sh
# 1. session31_call1.sh: the compact SSM kernel's ablations under ncu (B=32) and copy_rates.py
#    (the H100's ratios and rates are in ../session31/README.md);
# 2. the loop suite of the landed code, for the README's speed table;
# 3. the prefill suite (the fused pass now loads a chunk ahead: 0.984x at R=4096
#    on the H100).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=$O/abl timeout -k 5 200 bash benchmarks/results/commands_next/session31_call1.sh 2>&1 \
  | grep -E "^===|gpu__time|inst_executed|registers|issue_active|dram__|long_score|hit_rate|us  "
M2V_STAGES="loop prefill" M2V_LIMIT_LOOP=230 M2V_LIMIT_PREFILL=150 \
  OUT=$O/suites bash tools/run_gpu.sh 2>&1 | grep -E "^===|^\| (snap|comp|pack|one|ragg)" | cut -c1-160

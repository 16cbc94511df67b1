#!/bin/bash
# 2026-12-04 (session 21), call 6: the whole GPU suite (`pytest -m gpu`, 12 workers) on main
# as it ends the session (b1 tiles landed; tests' matrices restructured; the 133-row serial
# prefill test against the row-by-row kernels).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=450 OUT=$O timeout -k 10 480 bash tools/run_gpu.sh 2>&1 | tail -4
date -u

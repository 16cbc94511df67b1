#!/bin/bash
# Session 13, call 2: the GPU suite (pytest -m gpu) on main with this session's changes (the
# reference's entry points compiled whole in the tests, interpreted kernels' loops).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O/t
export PYTHONPATH=.
date -u
M2V_STAGES="gpu_tests" M2V_LIMIT_GPU_TESTS=480 M2V_TEST_WORKERS=10 OUT=$O/t bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | grep "passed\|failed\|FAILED\|Error\|exit" | tail -20
date -u

#!/bin/bash
# Ninth session, call 6: the sanitizer stage on this tree (v4 chunked kernels, packed prefill calls added), initcheck with XLA command buffers on; the SASS of the two-stage Mosaic GPU prototype.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=. JAX_COMPILATION_CACHE_DIR=/tmp/m2v_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
date -u > $O/device.txt; git log -1 --format='commit %H %s' >> $O/device.txt 2>&1
M2V_STAGES=sanitizer M2V_SANITIZER_TOOLS="memcheck initcheck" M2V_LIMIT_SANITIZER_WARM=110 M2V_LIMIT_SANITIZER_MEMCHECK=90 M2V_LIMIT_SANITIZER_INITCHECK=100 OUT=$O bash tools/run_gpu.sh > $O/stage.log 2>&1
grep "===\|ERROR SUMMARY\|done" $O/stage.log | tail -20
echo "=== initcheck, command buffers on $(date -u +%T)"
XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout -k 10 100 compute-sanitizer --tool initcheck --print-limit 10 python3 tools/sanitize_calls.py --geometry=small > $O/initcheck_command_buffers_on.log 2>&1
echo "exit $? $(date -u +%T)"; grep "ERROR SUMMARY\|done" $O/initcheck_command_buffers_on.log | tail -5
echo "=== racecheck, synccheck $(date -u +%T)"
export XLA_FLAGS="--xla_gpu_enable_command_buffer=" XLA_PYTHON_CLIENT_ALLOCATOR=platform
for t in synccheck racecheck; do timeout -k 10 80 compute-sanitizer --tool $t --print-limit 10 python3 tools/sanitize_calls.py --geometry=small > $O/sanitizer_$t.log 2>&1; echo "$t exit $? $(date -u +%T)"; grep "ERROR SUMMARY\|RACECHECK SUMMARY\|done" $O/sanitizer_$t.log | tail -4; done

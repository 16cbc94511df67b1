#!/bin/bash
# Ninth session, call 7: initcheck with XLA command buffers on, the deferred calls alone (call 6's run segfaulted there).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=. XLA_PYTHON_CLIENT_ALLOCATOR=platform
date -u > $O/device.txt
timeout -k 10 150 compute-sanitizer --tool initcheck --print-limit 10 python3 tools/sanitize_calls.py --geometry=small --modes=deferred > $O/initcheck_cb_deferred.log 2>&1
echo "exit $? $(date -u +%T)"; grep -v "^=========     " $O/initcheck_cb_deferred.log | tail -30

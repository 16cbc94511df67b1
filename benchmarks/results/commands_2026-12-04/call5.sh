#!/bin/bash
# Session 18, call 5: the one compiled test this session changed (16-bit state against the
# reference, now on the parity test's calls), on bc94bb2 or later.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
date -u
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider \
  "tests/test_state_dtype.py::TestStateDtypeCompiled::test_matches_reference" 2>&1 | tail -3 | tee $O/gpu_test_state_dtype.log
date -u

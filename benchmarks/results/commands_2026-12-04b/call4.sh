#!/bin/bash
# Session 19, call 4: the sanitizer stage (four tools) on HEAD (kernels of cba87ad).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O; R=/tmp/runs4; rm -rf $R
date -u
M2V_STAGES="sanitizer" M2V_LIMIT_SANITIZER_WARM=80 M2V_LIMIT_SANITIZER_MEMCHECK=70 \
  M2V_LIMIT_SANITIZER_SYNCCHECK=70 M2V_LIMIT_SANITIZER_INITCHECK=70 M2V_LIMIT_SANITIZER_RACECHECK=70 \
  OUT=$R bash tools/run_gpu.sh 2>&1 | grep -v "^I1\|^W1" | grep -E "===|SUMMARY|done|rror" | tail -40
cp $R/sanitizer_*.log $O/ 2>/dev/null
date -u

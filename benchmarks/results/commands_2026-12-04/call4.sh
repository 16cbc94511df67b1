#!/bin/bash
# Session 18, call 4: the verify kernels' long path at B=1 (prefill, chunked=False), body
# segments loading 1 (head/), 4 (the working tree, commit 9d75038) and 8 (d8/) rows ahead; the
# prefill suite's "serial" case in each tree in turn. The change was reverted after this call.
# To run it again from 9d75038, first:
#   D=benchmarks/results/commands_2026-12-04; mkdir -p $D/head $D/d8
#   git show 6459c72:m2v_jax/kernels/verify_ssm.py > $D/head/verify_ssm.py
#   sed 's/^BODY_AHEAD = 4$/BODY_AHEAD = 8/' m2v_jax/kernels/verify_ssm.py > $D/d8/verify_ssm.py
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
D=benchmarks/results/commands_2026-12-04
rm -rf /tmp/head /tmp/d8 /tmp/runs
for t in head d8; do cp -r . /tmp/$t && cp $D/$t/verify_ssm.py /tmp/$t/m2v_jax/kernels/; done
date -u
# As run, the loop read `head new d8 new`: the second new run overwrote the first one's JSON.
for tag in head new d8 new2; do
  tree=$([ ${tag#new} != $tag ] && echo $PWD || echo /tmp/$tag)
  (cd $tree && M2V_STAGES="prefill" M2V_LIMIT_PREFILL=70 \
    M2V_BENCH_ARGS="--lengths=24,37,48,72,136 --prefill_cases=serial" \
    OUT=/tmp/runs/$tag bash tools/run_gpu.sh 2>&1 | grep "^|.*B=1\|Error\|exit")
  cp /tmp/runs/$tag/prefill.json $O/prefill_$tag.json
done
date -u

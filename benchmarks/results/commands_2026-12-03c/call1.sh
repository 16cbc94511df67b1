#!/bin/bash
# Session 16, call 1: the body conv one row at a time with the hardware's exp2/reciprocal silu
# (16-bit y) and approximate exp in the output kernel (bf16 products), against HEAD's kernels
# (16cc126, copied into a second tree): prefill suite in each tree, ncu of the chunked
# kernels in each tree, then the ragged suite on the new tree.
# head/ held 16cc126's backend, chunk_conv, chunk_scan, rowmath and tiles.py (in commit c964239;
# remake with: for f in backend chunk_conv chunk_scan rowmath tiles; do
#   git show 16cc126:m2v_jax/kernels/$f.py > $D/head/$f.py; done).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
D=benchmarks/results/commands_2026-12-03c
rm -rf /tmp/old && cp -r . /tmp/old && cp $D/head/*.py /tmp/old/m2v_jax/kernels/
M="gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum"
date -u
for tree in /tmp/old $PWD; do
  tag=$([ $tree = /tmp/old ] && echo head || echo new)
  (cd $tree && M2V_STAGES="prefill" M2V_LIMIT_PREFILL=80 \
    M2V_BENCH_ARGS="--lengths=37,512,4096 --prefill_cases=chunked,highest" \
    OUT=$O/$tag bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit")
  (cd $tree && PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
    --kernel-name regex:m2v_chunk --launch-skip 6 --launch-count 6 --metrics $M \
    python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=2 \
    > $O/v8_ncu_chunk_$tag.txt 2>&1; echo "ncu $tag: exit $?")
  grep -E "^  m2v_chunk|duration|inst_executed|registers|warps_active|inst_issued|dram__" $O/v8_ncu_chunk_$tag.txt | head -60
  date -u
done
M2V_STAGES="ragged" M2V_LIMIT_RAGGED=70 OUT=$O/new bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
date -u

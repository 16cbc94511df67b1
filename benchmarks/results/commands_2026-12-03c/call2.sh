#!/bin/bash
# Session 17, call 2: three trees, A/B on the prefill suite (bf16 and "highest", R=37/512/4096):
#   head   = 16cc126's kernels (copies under head/);
#   approx = head plus approximate silu (conv and gate, 16-bit y) and exp (output kernel, bf16);
#   new    = approx plus the body conv walking its 32-row block one row at a time, unrolled.
# Then ncu of one chunked prefill (R=4096, bf16 table) in head and new, and the ragged suite
# on new. Each stage under a timeout; ncu output kept to one text file per tree.
# head/ held 16cc126's backend, chunk_conv, chunk_scan, rowmath and tiles.py (in commit c964239;
# remake with: for f in backend chunk_conv chunk_scan rowmath tiles; do
#   git show 16cc126:m2v_jax/kernels/$f.py > $D/head/$f.py; done).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
D=benchmarks/results/commands_2026-12-03c
rm -rf /tmp/head /tmp/approx
cp -r . /tmp/head && cp $D/head/*.py /tmp/head/m2v_jax/kernels/
cp -r . /tmp/approx && cp $D/head/chunk_conv.py /tmp/approx/m2v_jax/kernels/
sed -i 's/plan.y_dtype, not plan.interpret)$/plan.y_dtype, not plan.interpret, plan.silu)/' \
  /tmp/approx/m2v_jax/kernels/chunk_conv.py
grep -c "plan.silu" /tmp/approx/m2v_jax/kernels/chunk_conv.py
M="gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
date -u
for tag in head approx new; do
  tree=$([ $tag = new ] && echo $PWD || echo /tmp/$tag)
  (cd $tree && M2V_STAGES="prefill" M2V_LIMIT_PREFILL=80 \
    M2V_BENCH_ARGS="--lengths=37,512,4096 --prefill_cases=chunked,highest" \
    OUT=$O/$tag bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit")
done
date -u
for tag in head new; do
  tree=$([ $tag = new ] && echo $PWD || echo /tmp/$tag)
  for attempt in 1 2; do
    (cd $tree && PYTHONPATH=$tree XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 \
      ncu --clock-control none --kernel-name regex:m2v_chunk --launch-count 8 --metrics $M \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1 \
      > $O/v8_ncu_chunk_$tag.txt 2>&1)
    rc=$?; echo "ncu $tag attempt $attempt: exit $rc"; [ $rc = 0 ] && break
  done
  grep -E "^  m2v_chunk|duration|inst_executed|registers|warps_active|inst_issued|dram__|long_score" \
    $O/v8_ncu_chunk_$tag.txt | head -80
  date -u
done
M2V_STAGES="ragged" M2V_LIMIT_RAGGED=70 OUT=$O/ragged bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
date -u

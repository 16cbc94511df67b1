#!/bin/bash
# Session 17, call 3: head (16cc126's kernels, copies under head/) against the body conv with
# every input row of its block loaded before the first store (and approximate silu at 16-bit
# y): prefill suite in each tree; ncu of one R=4096 bf16 prefill in the new tree, then of
# its conv at conv_cols 512; the ragged suite on the new tree. Only the JSON results and
# the ncu text files are left under $OUT (the device tool returns few files).
# head/ held 16cc126's backend, chunk_conv, chunk_scan, rowmath and tiles.py (in commit c964239;
# remake with: for f in backend chunk_conv chunk_scan rowmath tiles; do
#   git show 16cc126:m2v_jax/kernels/$f.py > $D/head/$f.py; done).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
D=benchmarks/results/commands_2026-12-03c
rm -rf /tmp/head /tmp/runs && cp -r . /tmp/head && cp $D/head/*.py /tmp/head/m2v_jax/kernels/
M="gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
date -u
for tag in head new head new; do
  tree=$([ $tag = new ] && echo $PWD || echo /tmp/$tag)
  (cd $tree && M2V_STAGES="prefill" M2V_LIMIT_PREFILL=80 \
    M2V_BENCH_ARGS="--lengths=37,512,4096 --prefill_cases=chunked,highest" \
    OUT=/tmp/runs/$tag bash tools/run_gpu.sh 2>&1 | grep "^|.*B=1\|Error\|exit")
  cp /tmp/runs/$tag/prefill.json $O/prefill_$tag.json
done
date -u
T=128:64:4:1:64:4:16:2:4:1:1:32
for variant in "256 m2v_chunk 8" "512 m2v_chunk_conv_snapshot 2"; do
  set -- $variant
  for attempt in 1 2; do
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 \
      ncu --clock-control none --kernel-name regex:$2 --launch-count $3 --metrics $M \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1 \
      --chunk_tiles=$T:$1:4:64:1 > $O/ncu_conv_cols$1.txt 2>&1
    rc=$?; echo "ncu conv_cols=$1 attempt $attempt: exit $rc"; [ $rc = 0 ] && break
  done
  grep -E "^  m2v_chunk|duration|inst_executed|registers|warps_active|inst_issued|dram__|long_score" \
    $O/ncu_conv_cols$1.txt | grep -v "^  m2v_chunk_tail\|^  m2v_chunk_conv_head" | head -40
done
date -u
M2V_STAGES="ragged" M2V_LIMIT_RAGGED=70 OUT=/tmp/runs/ragged bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
cp /tmp/runs/ragged/ragged.json $O/ragged_new.json
date -u

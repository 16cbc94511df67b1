#!/bin/bash
# Session 15, call 1: ChunkTiles.fused_pass (v7) against the table in the chunk sweep (bf16,
# R=4096), ncu of the fused kernel, then the sanitizer stage (fused chunked prefill included).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
T="128:16:4:1:64:4:16:2:4:1:1:32:256:4"
V="$T:64:0,$T:64:1,128:16:4:1:64:8:16:2:4:1:1:32:256:4:64:1,128:16:4:1:64:4:16:1:4:1:1:32:256:4:64:1,128:16:4:1:32:4:16:2:4:1:1:32:256:4:64:1"
M2V_STAGES="chunk_sweep" M2V_LIMIT_CHUNK_SWEEP=150 M2V_BENCH_ARGS="--chunk_variants=$V" \
  OUT=$O bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
for f in 0 1; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_chunk \
    --launch-skip 5 --launch-count 5 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum \
    python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1 \
    --chunk_tiles="$T:64:$f" > $O/v7_ncu_chunk_fused$f.txt 2>&1
  echo "ncu fused_pass=$f: exit $?"; grep -E "m2v_chunk|duration|inst_executed|registers|warps_active|inst_issued|dram__" $O/v7_ncu_chunk_fused$f.txt | head -60
done
M2V_STAGES="sanitizer" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | tail -30
date -u

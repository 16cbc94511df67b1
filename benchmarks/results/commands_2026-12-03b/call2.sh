#!/bin/bash
# Session 15, call 2: the fused chunk-states/state-passing kernel at the pass kernel's P tile
# (block_p 64/32/16) and warps, bf16 and float32 activations, R=4096; ncu of the fused kernel.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
E=":1:1:32:256:4:64"
V="128:16:4:1:64:4:16:2:4$E:0,128:64:4:1:64:4:16:2:4$E:1,128:32:4:1:64:4:16:2:4$E:1,128:16:4:1:64:4:16:2:4$E:1,128:16:4:1:64:2:16:2:4$E:1,128:32:4:1:64:8:16:2:4$E:1"
M2V_STAGES="chunk_sweep" M2V_LIMIT_CHUNK_SWEEP=150 M2V_BENCH_ARGS="--chunk_variants=$V" \
  OUT=$O bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
VF="64:16:4:1:64:4:16:2:4$E:0,64:32:4:1:64:4:16:2:4$E:1,64:16:4:1:64:4:16:2:4$E:1,64:16:4:1:64:2:16:2:4$E:1"
M2V_STAGES="chunk_sweep" M2V_LIMIT_CHUNK_SWEEP=150 M2V_BENCH_ARGS="--dtype=float32 --chunk_variants=$VF" \
  OUT=$O/f bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
cp $O/f/chunk_sweep.json $O/chunk_sweep_f32.json; rm -rf $O/f
for bp in 32 16; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_chunk_states_pass \
    --launch-skip 1 --launch-count 1 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,lts__t_bytes.sum \
    python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=1 \
    --chunk_tiles="128:$bp:4:1:64:4:16:2:4$E:1" > $O/ncu_fused_bp$bp.txt 2>&1
  echo "ncu block_p=$bp: exit $?"; grep -E "m2v_chunk|duration|inst_executed|registers|warps_active|inst_issued|dram__|lts__" $O/ncu_fused_bp$bp.txt | head -12
done
date -u

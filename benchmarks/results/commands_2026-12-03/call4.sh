#!/bin/bash
# Session 14, call 4: out_rows at the "highest" precision (float32 activations), ncu of the
# chunked prefill's kernels at out_rows 64 and 128 (bf16, R=4096), the sanitizer stage.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
date -u
VF="128:16:4:1:64:4:16:2:4:1:1:32:256:4:64,128:16:4:1:64:4:16:2:4:1:1:32:256:4:32,128:16:4:1:64:4:16:2:8:1:1:32:256:4:64"
M2V_STAGES="chunk_sweep" M2V_LIMIT_CHUNK_SWEEP=150 M2V_BENCH_ARGS="--dtype=float32 --chunk_variants=$VF" \
  OUT=$O/f bash tools/run_gpu.sh 2>&1 | grep "^|\|Error\|exit"
cp $O/f/chunk_sweep.json $O/chunk_sweep_f32.json
for r in 64 128; do
  M2V_STAGES="ncu_chunk" M2V_LIMIT_NCU_CHUNK=100 \
    M2V_PROFILE_ARGS="--chunk_tiles=128:16:4:1:64:4:16:2:4:1:1:32:256:4:$r" OUT=$O/n$r bash tools/run_gpu.sh >/dev/null 2>&1
  cp $O/n$r/ncu_chunk.log $O/ncu_chunk_out_rows$r.log
  grep -E "m2v_chunk|gpu__time|inst_executed|registers_per|warps_active|issue_active|dram__" $O/n$r/ncu_chunk.log | head -48
done
M2V_STAGES="sanitizer" OUT=$O/s bash tools/run_gpu.sh 2>&1 | grep -E "ERROR SUMMARY|exit|===" | tail -20
for t in memcheck synccheck initcheck racecheck; do cp $O/s/sanitizer_$t.log $O/ 2>/dev/null; done
rm -rf $O/f $O/n64 $O/n128 $O/s
date -u

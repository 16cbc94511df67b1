#!/bin/bash
# For a later session: the scratch limit (`ChunkTiles.scratch_mb`, 100 MB a sequence by
# default; session 27, not yet measured). Run from the repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session28_segments.sh
# 1. XLA's temporary bytes of compiled prefills, the limit on and off (compile only).
# 2. chunk_sweep at R=4096: the table (bf16: two segments; float32: nine) against the same
#    tiles with scratch_mb=0 (one scan), interleaved; both checked against the serial kernel.
# 3. prefill (chunked, R=37/512/4096) and ragged (8 packed prompts: one segment; one prompt
#    of 13,700 rows: seven; the 4000- and 3100-row prompts one by one: two each).
# 4. "highest" with bfloat16 activations (products keep the post-conv rows whole, session
#    27): chunk_sweep at R=4096, the table (64-row chunks, two kernels, seven segments)
#    against one scan, 128-row chunks, and the fused pass at 64 and 128 rows.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
echo "=== memory $(date -u +%T)"
timeout -k 5 150 python3 tools/prefill_memory.py --dtypes=bfloat16 --out=$O/memory_bf16.json \
  2>&1 | grep -E "^\{|Error" | tee $O/memory_bf16.txt
timeout -k 5 90 python3 tools/prefill_memory.py --dtypes=float32 --lengths=4096 --packed= \
  --out=$O/memory_f32.json 2>&1 | grep -E "^\{|Error" | tee $O/memory_f32.txt
BF=128:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1:0      # the bf16 table entry, one scan
F32=64:16:4:1:64:4:16:2:4:1:1:32:256:4:64:0:0      # the float32 table entry, one scan
echo "=== chunk_sweep bf16 $(date -u +%T)"
timeout -k 5 150 python3 benchmarks/bench.py --suites=chunk_sweep --chunk_variants=$BF \
  --out=$O/segments_sweep_bf16.json 2>&1 | grep -E "^\||Error|error" | tee $O/segments_sweep_bf16.txt
echo "=== chunk_sweep float32 $(date -u +%T)"
timeout -k 5 150 python3 benchmarks/bench.py --suites=chunk_sweep --dtype=float32 \
  --chunk_variants=$F32 --out=$O/segments_sweep_f32.json 2>&1 | grep -E "^\||Error|error" \
  | tee $O/segments_sweep_f32.txt
echo "=== prefill $(date -u +%T)"
timeout -k 5 120 python3 benchmarks/bench.py --suites=prefill --prefill_cases=chunked \
  --lengths=37,512,4096 --out=$O/prefill.json 2>&1 | grep -E "^\||Error" | tee $O/prefill.txt
echo "=== ragged $(date -u +%T)"
timeout -k 5 150 python3 benchmarks/bench.py --suites=ragged --out=$O/ragged.json 2>&1 \
  | grep -E "^\||Error" | tee $O/ragged.txt
H=64:16:4:1:64:4:16:2:4:1:1:32:256:4:64:0:0,128:16:4:1:64:4:16:2:4:1:1:32:256:4:64:0,64:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1,128:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1
echo "=== chunk_sweep highest $(date -u +%T)"
timeout -k 5 200 python3 benchmarks/bench.py --suites=chunk_sweep --prefill_precision=highest \
  --chunk_variants=$H --out=$O/highest_sweep.json 2>&1 | grep -E "^\||Error|error" \
  | tee $O/highest_sweep.txt
echo "=== done $(date -u +%T)"

#!/usr/bin/env bash
# Call 4 (2026-12-02, seventh session): XLA's optimized HLO of the sanitizer's compact and deferred calls (is the pool copied inside the chunked prefill?)
set -u
{ date -u; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > $OUT/device.txt 2>&1
echo "command: OUT=... bash .ab/call4.sh (working tree: 77c0047 + this session's changes)" >> $OUT/device.txt
for mode in compact deferred; do
  rm -rf /tmp/dump_$mode
  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="--xla_dump_to=/tmp/dump_$mode --xla_dump_hlo_as_text" PYTHONPATH=$PWD timeout -k 5 150 python3 tools/sanitize_calls.py --geometry=small --modes=$mode > $OUT/run_$mode.log 2>&1
  echo "$mode rc $? $(date -u +%T)" >> $OUT/device.txt
  mkdir -p $OUT/$mode
  for f in $(grep -l "m2v_chunk_pass" /tmp/dump_$mode/*after_optimizations.txt 2>/dev/null); do cp $f $OUT/$mode/; done
  for f in $(grep -l "m2v_chunk_pass" /tmp/dump_$mode/*buffer-assignment.txt 2>/dev/null); do cp $f $OUT/$mode/; done
  ls /tmp/dump_$mode | head -50 > $OUT/${mode}_files.txt
done
cd $OUT && tar czf all.tgz device.txt run_*.log *_files.txt compact deferred 2>/dev/null; ls

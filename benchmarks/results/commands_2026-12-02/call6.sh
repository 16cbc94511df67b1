#!/usr/bin/env bash
# Call 6 (2026-12-02, seventh session): prefill and ragged suites of the current code.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > $OUT/device.txt 2>&1
echo "command: OUT=... bash .ab/call6.sh (working tree of d3e0240)" >> $OUT/device.txt
timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill --lengths=37,512,4096 --prefill_cases=chunked,highest,dense --out=$OUT/prefill.json > $OUT/prefill.log 2>&1
echo "prefill rc $? $(date -u +%T)" >> $OUT/device.txt
timeout -k 5 100 python3 benchmarks/bench.py --suites=ragged --out=$OUT/ragged.json > $OUT/ragged.log 2>&1
echo "ragged rc $? $(date -u +%T)" >> $OUT/device.txt
cd $OUT && tar czf all.tgz *.txt *.log *.json 2>/dev/null; ls

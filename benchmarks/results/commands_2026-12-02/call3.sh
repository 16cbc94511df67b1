#!/usr/bin/env bash
# Call 3 (2026-12-02, seventh session): loop suite, HEAD (old) and the working tree (new) alternated twice; compiled shared-entry tests.
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > $OUT/device.txt 2>&1
echo "command: OUT=... bash .ab/call3.sh (old = 77c0047, new = 77c0047 + working tree: bench index args, conv-launch shared check)" >> $OUT/device.txt
for run in 1 2; do for v in old new; do
  (cd .ab/$v && PYTHONPATH=$PWD PYTHONUNBUFFERED=1 timeout -k 5 200 python3 benchmarks/bench.py --suites=loop --batches=1,8,32,128 --windows=32 --vary_batches= --blocks=11 --out=$OUT/loop_${v}_run$run.json > $OUT/loop_${v}_run$run.log 2>&1)
  echo "loop $v run$run rc $? $(date -u +%T)" >> $OUT/device.txt
done; done
(cd .ab/new && PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 150 python3 -m pytest -q -m gpu tests/test_pools.py tests/test_snapshot.py tests/test_lowering.py -k "shared or Shared or entries" -p no:cacheprovider -p no:benchmark > $OUT/gpu_tests_shared.log 2>&1)
echo "gpu tests rc $? $(date -u +%T)" >> $OUT/device.txt
cd $OUT && tar czf all.tgz *.txt *.log *.json 2>/dev/null; ls

#!/bin/bash
# 2026-12-04 (session 21), call 5: the serial prefill's body by products (64-row segments,
# then 32, 16, 8 and a tail, each y and fold by tensor-core products) against the chunked
# path at B=1; ncu of its SSM kernel at R=512; then the compiled snapshot, compact and prefill
# tests (the GPU suite less its 4000-row Bolt pool tests).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
git log -1 --format='tree at commit %H' | tee $O/commit.txt
PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill \
  --lengths=24,37,72,136,264,512,4096 --prefill_cases=serial,chunked --blocks=9 \
  --out=$O/prefill_serial.json 2>&1 | grep -E "^\|" | tee $O/prefill_serial.txt
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
  --kernel-name regex:'m2v_' --launch-skip 2 --launch-count 2 --metrics $M \
  python3 tools/profile_call.py --mode=snapshot --batch=1 --rows=512 --prefill --nochunked --calls=2 2>&1 \
  | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' | tee $O/ncu_serial_512.txt
M2V_STAGES="gpu_tests" M2V_GPU_TESTS_K="(Snapshot or Compact or Prefill or Packed or State or Deferred) and not bolt_chunked_pool" \
  M2V_LIMIT_GPU_TESTS=300 OUT=$O timeout -k 10 320 bash tools/run_gpu.sh 2>&1 | tail -4
date -u

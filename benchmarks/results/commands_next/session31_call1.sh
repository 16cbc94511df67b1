#!/bin/bash
# Session 31, call 1: session 30's ablations of the compact SSM kernel (ncu, B=32), then the
# device's in-place copy rate of the state bank by XLA and by Pallas programs of the kernel's
# tile shapes (copy_rates.py, B=32 and 128). From the repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session31_call1.sh
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/commands_next
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
git log -1 --format='commit %H %s' | tee -a $O/device.txt
OUT=$O timeout -k 5 330 bash $D/session30_ablate.sh 2>&1 | grep -v "^  *[a-z_]*\.\(log\|txt\|gz\)$" | tail -60
for b in 32 128; do
  echo "=== copy_rates B=$b $(date -u +%T)"
  timeout -k 5 120 python3 $D/copy_rates.py --batch=$b --json=$O/copy_rates_b$b.json 2>&1 | grep -v "^{"
done 2>&1 | tee $O/copy_rates.txt
echo "=== call1 done $(date -u +%T)"

#!/bin/bash
# Session 34: ncu of the snapshot SSM launch at B=32, R=16 (capacity 16), chain and tree,
# with y left out (a copy of the package whose segment_y returns at once; timing only).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O /tmp/noy
rm -rf /tmp/noy/m2v_jax && cp -r m2v_jax /tmp/noy/m2v_jax
python3 - <<'PY'
p = "/tmp/noy/m2v_jax/kernels/verify_ssm.py"
s = open(p).read()
y = '    """Stores y of rows t0..t0+L-1 from start state S (exact in `held`); 0 past num_rows, gated."""\n'
assert s.count(y) == 1
open(p, "w").write(s.replace(y, y + "    return\n"))
PY
export XLA_PYTHON_CLIENT_PREALLOCATE=false
N=gpu__time_duration.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed
i=0
for spec in "snapshot" "snapshot --tree"; do
  i=$((i+1))
  echo "=== ncu noy $i: $spec" | tee $O/ncu_noy_$i.txt
  PYTHONPATH=/tmp/noy:$PWD timeout -k 5 80 ncu --clock-control none --kernel-name regex:'m2v_ssm' \
    --launch-skip 1 --launch-count 1 --metrics $N python3 tools/profile_call.py --mode=$spec \
    --batch=32 --rows=16 --capacity=16 --calls=1 >> $O/ncu_noy_$i.txt 2>&1
  grep -E "m2v_|gpu__time|inst_exec|registers|warps_active|dram" $O/ncu_noy_$i.txt \
    | sed -E 's/ +/ /g' | cut -c1-90
done

#!/bin/bash
# Every kernel of one call (XLA's too) under ncu at B=32: Mosaic GPU vs Triton SSM launch,
# compact (default and W=32) and snapshot; then the loop suite at B=8/32 for both.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=.
M="gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size"
run() { local name=$1; shift
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none --launch-skip 40 --launch-count 40 \
    --metrics $M --csv python tools/profile_call.py --batch=32 --calls=10 "$@" > $O/ncu_$name.csv 2> $O/ncu_$name.err
  echo "== $name rc=$?"; }
run mg_compact --mode=compact --tiles=64:4:64:mosaic=1
run tr_compact --mode=compact
run mg_snapshot --mode=snapshot --tiles=64:4:64:mosaic=1
run mg_w32 --mode=compact --window=32 --tiles=64:4:64:mosaic=1
run tr_w32 --mode=compact --window=32
python - <<'PY'
import csv, glob, os, collections
O=os.environ.get("OUT","/tmp/out")
for f in sorted(glob.glob(O+"/ncu_*.csv")):
  rows=[r for r in csv.reader(open(f)) if len(r)>10]
  if not rows: print(f, "empty"); continue
  h=rows[0]; ki=h.index("Kernel Name"); mi=h.index("Metric Name"); vi=h.index("Metric Value"); ii=h.index("ID")
  per=collections.defaultdict(dict)
  for r in rows[1:]:
    per[(int(r[ii]), r[ki][:60])][r[mi]]=r[vi]
  print("###", os.path.basename(f))
  for (i,k),m in sorted(per.items())[:40]:
    print(i, k, m.get("gpu__time_duration.sum"), m.get("sm__inst_executed.sum"), m.get("launch__registers_per_thread"), m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"), m.get("launch__grid_size"), m.get("launch__block_size"))
PY
M2V_STAGES="loop" M2V_LIMIT_LOOP=250 M2V_BENCH_ARGS="--tiles=64:4:64:mosaic=1 --windows=32 --batches=8,32" OUT=$O bash tools/run_gpu.sh 2>&1 | grep -v "^E12" | tail -30

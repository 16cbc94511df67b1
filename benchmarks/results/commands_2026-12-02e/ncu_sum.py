import csv, collections, sys, os
for f in sys.argv[1:]:
  rows = [r for r in csv.reader(open(f)) if len(r) > 10]
  if not rows: print("###", f, "empty"); continue
  h = rows[0]; ki, mi, vi, ii = (h.index(k) for k in ("Kernel Name", "Metric Name", "Metric Value", "ID"))
  per = collections.defaultdict(dict)
  for r in rows[1:]: per[(int(r[ii]), r[ki][:48])][r[mi]] = r[vi]
  print("###", os.path.basename(f), len(per), "kernels; the last 30:")
  for (i, k), m in sorted(per.items())[-30:]:
    print(i, k, *(m.get(x) for x in ("gpu__time_duration.sum", "sm__inst_executed.sum",
          "launch__registers_per_thread", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
          "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__grid_size", "launch__block_size")))

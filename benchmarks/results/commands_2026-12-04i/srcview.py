# Writes an ncu source-page CSV (gzip) as one line per SASS instruction: python3 srcview.py src_out.csv.gz src_out.txt
import csv, gzip, sys, collections
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt')))
h = rows[1]; body = [r for r in rows[2:] if len(r) == len(h)]
ci = {c: i for i, c in enumerate(h)}
samp, inst = ci['Warp Stall Sampling (All Samples)'], ci['Instructions Executed']
reasons = [c for c in h if c.startswith('stall_') and '(' not in c]
out = []
for k, r in enumerate(body):
    top = sorted(((float(r[ci[c]] or 0), c[6:]) for c in reasons), reverse=True)[:3]
    out.append((k, int(float(r[inst])), int(float(r[samp])), r[ci['Source']].strip(), [(c, int(v)) for v, c in top if v > 0]))
with open(sys.argv[2], 'w') as f:
    f.write(f"# ncu SourceCounters by SASS instruction: index, warp instructions executed, stall samples, SASS, top stall reasons\n")
    for k, n, s, src, top in out:
        f.write(f"{k:5d} {n:9d} {s:5d} {src:60s} {top}\n")
tot_s = sum(o[2] for o in out); tot_i = sum(o[1] for o in out)
print('instructions', len(out), 'warp inst', tot_i, 'samples', tot_s)
agg = collections.Counter()
for c in reasons: agg[c[6:]] = sum(float(r[ci[c]] or 0) for r in body)
print('reasons:', [(c, round(v / tot_s * 100, 1)) for c, v in agg.most_common(8)])

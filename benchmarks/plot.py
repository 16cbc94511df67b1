"""Time per layer against batch size, both replay modes beside their floors, as a PNG.

Reads the `loop` suite's JSON (each call draws its state_row from the acceptance mix) and,
if given, a second run of the same suite (for instance the previous kernels) drawn dashed:

    python benchmarks/plot.py --json=benchmarks/results/loop.json \\
        --previous=benchmarks/results/previous_kernel.json \\
        --out=benchmarks/results/verify_time_vs_batch.png

Needs matplotlib (`pip install -e ".[plot]"`); the library does not.
"""

from __future__ import annotations

import json
import re

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("json", "benchmarks/results/loop.json", "the loop suite's results")
flags.DEFINE_string("previous", None, "another run of the loop suite, drawn dashed")
flags.DEFINE_string("out", "benchmarks/results/verify_time_vs_batch.png", "the PNG to write")

_NAME = re.compile(r"^(snapshot|compact) B=(\d+) R=8 row=accept pallas$")


def series(path):
  """{mode: [(B, median µs, floor µs)]} of a loop-suite JSON (fixed num_rows rows only)."""
  with open(path) as fh:
    rows = json.load(fh)["loop"]
  out = {}
  for r in rows:
    m = _NAME.match(r["name"])
    if m:
      out.setdefault(m.group(1), []).append((int(m.group(2)), r["median_us"], r["floor_us"]))
  return {k: sorted(v) for k, v in out.items()}


def main(argv):
  del argv
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  now = series(FLAGS.json)
  with open(FLAGS.json) as fh:
    meta = json.load(fh)["meta"]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  colors = {"snapshot": "tab:blue", "compact": "tab:orange"}
  for mode, pts in now.items():
    b, t, f = zip(*pts)
    ax.plot(b, t, "o-", color=colors[mode], label=f"{mode}")
    ax.plot(b, f, ":", color=colors[mode], label=f"{mode} floor (bytes / copy bandwidth)")
  if FLAGS.previous:
    for mode, pts in series(FLAGS.previous).items():
      b, t, _ = zip(*pts)
      ax.plot(b, t, "x--", color=colors[mode], alpha=0.5, label=f"{mode}, previous kernels")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("sequences in the batch (B)")
  ax.set_ylabel("µs per layer and call (median)")
  ax.set_title(f"Verify R=8, state_row drawn per call, {meta['device']}, {meta['date'][:10]}",
               fontsize=10)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(FLAGS.out, dpi=110)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)

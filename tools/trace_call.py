"""Device timeline of verify calls from JAX's profiler: each kernel's duration and the gap
before it, and per call the kernels' sum against the span they cover.

Runs `--calls` calls of one configuration inside one jitted step (as `benchmarks/bench.py`
times them: the rows are arguments of the step, not constants XLA could fold), traces a few
steps with `jax.profiler` (CUPTI on a GPU), and reads the Perfetto trace it writes. Where
ncu serializes launches and times each kernel alone, this shows the launch gaps and anything
else that runs on the device between a call's kernels:

    python tools/trace_call.py --mode=compact --batch=1 --calls=16
    python tools/trace_call.py --prefill --mode=snapshot --batch=1 --rows=4096 --calls=2
    python tools/trace_call.py --mode=snapshot --packed=300,4000,1500,800 --calls=2
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import m2v_jax as m
from m2v_jax import dispatch, status

FLAGS = flags.FLAGS


def _define_flags():
  """The CLI's flags, defined only when run as a program (importing defines none)."""
  flags.DEFINE_enum("mode", "compact", ["snapshot", "compact"], "replay mode")
  flags.DEFINE_integer("batch", 1, "sequences B")
  flags.DEFINE_integer("rows", 8, "rows R per call")
  flags.DEFINE_integer("calls", 16, "calls per jitted step")
  flags.DEFINE_integer("steps", 3, "traced steps")
  flags.DEFINE_integer("window", None, "compact mode: deferred-commit window W")
  flags.DEFINE_integer("capacity", None, "capacity (default: the geometry's, 8)")
  flags.DEFINE_bool("tree", False, "every call verifies one random draft tree (each row's "
                    "parent drawn among the rows before it; R <= capacity)")
  flags.DEFINE_bool("public", False, "each call through `dispatch.call` (the jitted body of "
                    "`m2v_jax.verify`, entries checked on the device; the table's tiles) "
                    "instead of the kernels alone")
  flags.DEFINE_string("tiles", None,
                      "verify tiles, as `TileConfig.replace_from_text` reads them")
  flags.DEFINE_string("chunk_tiles", None,
                      "--prefill on the chunked path: its tiles, as `ChunkTiles.from_text` "
                      "reads them (fields not given: ChunkTiles' defaults; without the flag, "
                      "the table's)")
  flags.DEFINE_bool("prefill", False, "each call a prefill of --rows rows through "
                    "`dispatch.call` with the default path (chunked or not), the table's tiles "
                    "(or --chunk_tiles), every sequence from its state after the previous "
                    "call's row 0")
  flags.DEFINE_list("packed", None, "each call a packed prefill (`cu_seqlens`) of prompts of "
                    "these lengths, one pool entry each (--batch and --rows unused)")
  flags.DEFINE_bool("copies", False, "also print the compiled step's copy and "
                    "dynamic-update-slice instructions of 65,536 elements or more (XLA's "
                    "HLO, from a separate compile of the step), with their shapes")
  flags.DEFINE_integer("show", 12, "device events printed, from the last traced step")
  flags.DEFINE_enum("geometry", "bolt", ["bolt", "small"], "bolt, or a small one for a CPU run "
                    "(kernels interpreted)")


def device_events(trace_dir):
  """[(name, start µs, duration µs)] of the trace's device events (GPU streams, or the CPU
  backend's XLA ops), sorted by start."""
  path = max(glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"),
                       recursive=True), key=os.path.getmtime)
  with gzip.open(path, "rt") as fh:
    events = json.load(fh)
  events = events["traceEvents"] if isinstance(events, dict) else events
  names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  gpu = {pid for pid, n in names.items() if "GPU" in n or "gpu" in n}
  pids = gpu or {pid for pid, n in names.items() if "XLA" in n or "CPU" in n}
  out = [(e["name"], float(e["ts"]), float(e.get("dur", 0.0))) for e in events
         if e.get("ph") == "X" and e.get("pid") in pids and not e["name"].startswith("$")]
  return sorted(out, key=lambda e: e[1])


def busy_by_kernel(events, width=40):
  """{kernel name (its first `width` characters): summed device µs} of `device_events`."""
  busy = collections.Counter()
  for name, _, dur in events:
    busy[name.split("(")[0][:width]] += dur
  return busy


def main(argv):
  del argv
  backend = m.resolve_backend(None)
  if backend != "pallas":
    backend = "interpret"              # no GPU: the kernels interpreted on the CPU
  geometry = m.BOLT if FLAGS.geometry == "bolt" else m.Mamba2Config(nheads=8, headdim=16,
                                                                    dstate=32, ngroups=2)
  cfg = geometry.replace(replay_mode=FLAGS.mode, capacity=FLAGS.capacity or geometry.capacity,
                         window=FLAGS.window if FLAGS.mode == "compact" else None)
  B, R, K = FLAGS.batch, FLAGS.rows, FLAGS.calls
  lengths = [int(n) for n in FLAGS.packed or ()]
  if lengths:
    if FLAGS.tree or FLAGS.tiles or FLAGS.chunk_tiles or FLAGS.public or FLAGS.prefill:
      raise app.UsageError("--packed: a packed prefill on the table's tiles, no other flag")
    B, R = len(lengths), sum(lengths)
  rng = np.random.default_rng(0)
  params = m.random_params(cfg)
  drawn = 1 if lengths else B          # packed: one flat [T, ...] array
  xbc = jnp.asarray(rng.normal(size=(drawn, R, cfg.conv_dim)), jnp.bfloat16)
  dt = jnp.asarray(rng.normal(-1.0, 1.0, size=(drawn, R, cfg.nheads)), jnp.bfloat16)
  rows = jnp.asarray(np.arange(B) % R, jnp.int32)
  ci, nr = jnp.arange(B, dtype=jnp.int32), jnp.full((B,), R, jnp.int32)
  tiles = m.tile_config(cfg, B, R, jnp.bfloat16)
  public = FLAGS.public or FLAGS.prefill
  if FLAGS.tiles:
    if public:
      raise app.UsageError("--tiles: --public and --prefill run the table's verify tiles "
                           "(dispatch.call)")
    tiles = tiles.replace_from_text(FLAGS.tiles)
  if FLAGS.prefill:
    if FLAGS.tree:
      raise app.UsageError("--prefill: a draft tree is a verify call")
    rows = jnp.zeros((B,), jnp.int32)
  if lengths:                          # flat rows [T, ...], the offsets as device values
    xbc, dt = xbc[0], dt[0]
    rows = jnp.zeros((B,), jnp.int32)
    nr = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
  chunked = FLAGS.prefill and dispatch.use_chunked(
      cfg, backend, R, None, jnp.bfloat16, batch=B)
  chunk_tiles = None
  if FLAGS.chunk_tiles:
    if not chunked:
      raise app.UsageError("--chunk_tiles: a prefill on the chunked path only")
    try:
      chunk_tiles = m.ChunkTiles.from_text(FLAGS.chunk_tiles)
    except ValueError as err:
      raise app.UsageError(f"--chunk_tiles: {err}") from None

  parents = None
  if FLAGS.tree:
    par = np.floor(rng.random((B, R)) * np.maximum(np.arange(R), 1)).astype(np.int32)
    par[:, 0] = -1
    parents = jnp.asarray(par)

  def many(s, r, ci, nr, xbc, dt):
    ys = []
    for _ in range(K):
      if lengths:                      # nr: cu_seqlens
        y, s = dispatch.packed(params, s, status.CallArgs(xbc, dt, r, None, ci, None), nr,
                               cfg=cfg, backend=backend)
        ys.append(y)
        continue
      args = status.call_args(xbc, dt, r, None, ci, nr)
      if public:
        y, s = dispatch.call(params, s, args, cfg=cfg, backend=backend, chunked=chunked,
                             ragged=False, entries_checked=False, parents=parents,
                             chunk_tiles=chunk_tiles)
      else:
        y, s = dispatch.kernel_call(cfg, backend, params, s, args, tiles, parents=parents)
      ys.append(y)
    return s, ys

  step = jax.jit(many, donate_argnums=0)
  state = m.init_state(cfg, B, jnp.bfloat16)
  if FLAGS.copies:                     # XLA's copies in the compiled step, with their shapes
    text = step.lower(state, rows, ci, nr, xbc, dt).compile().as_text()
    for line in text.splitlines():
      hit = re.search(r"= \w+\[([\d,]*)\]\S* (copy|copy-start|dynamic-update-slice)\(", line)
      if hit and np.prod([int(d) for d in hit.group(1).split(",") if d]) >= 1 << 16:
        print("hlo:", line.strip()[:300])
  state, _ = step(state, jnp.zeros((B,), jnp.int32), ci, nr, xbc, dt)  # compile; R rows pending
  for _ in range(2):
    state, _ = step(state, rows, ci, nr, xbc, dt)
  jax.block_until_ready(state)
  trace_dir = tempfile.mkdtemp(prefix="m2v_trace_")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(FLAGS.steps):
      state, ys = step(state, rows, ci, nr, xbc, dt)
    jax.block_until_ready((state, ys))
  events = device_events(trace_dir)
  per_step = len(events) // FLAGS.steps
  last = events[-per_step:] if per_step else []
  kind = (f" packed {','.join(map(str, lengths))}" if lengths else " tree" if FLAGS.tree
          else " prefill, chunked" if chunked else " prefill" if FLAGS.prefill else "")
  print(f"{cfg.replay_mode} B={B} R={R}{kind} on {backend}: "
        f"{len(events)} device events in "
        f"{FLAGS.steps} steps of {K} calls ({trace_dir})")
  print("| event | start µs | µs | gap before µs |\n|---|---|---|---|")
  for i, (name, ts, dur) in enumerate(last[:FLAGS.show]):
    gap = ts - (last[i - 1][1] + last[i - 1][2]) if i else 0.0
    print(f"| {name[:48]} | {ts - last[0][1]:.1f} | {dur:.2f} | {gap:.2f} |")
  if last:
    span = last[-1][1] + last[-1][2] - last[0][1]
    busy = busy_by_kernel(last)
    print(f"\nper call: span {span / K:.2f} µs, device busy {sum(busy.values()) / K:.2f} µs")
    for name, total in busy.most_common(8):
      print(f"  {name}: {total / K:.2f} µs per call")


if __name__ == "__main__":
  _define_flags()
  app.run(main)

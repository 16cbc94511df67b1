"""The chunked prefill's device memory as XLA compiles it, beside the library's own count.

For each case (B=1 prefills of R rows at Bolt geometry, snapshot mode, and the packed prompts
of the `ragged` benchmark suite), compiles the call at the table's `ChunkTiles` and with
`scratch_mb=0` (one segment), and reports XLA's temporary bytes
(`memory_analysis().temp_size_in_bytes`: the kernels' scratch and every other intermediate),
`chunk_scan.scratch_bytes`, the segments and the seconds the compile took, as JSON. Compiles
only: nothing runs.

    python tools/prefill_memory.py --out=$OUT/prefill_memory.json   # on a GPU
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
from absl import app, flags

import m2v_jax as m
from m2v_jax import dispatch
from m2v_jax.kernels import chunk_scan

flags.DEFINE_list("lengths", ["512", "4096", "13700"], "prefill rows R of the B=1 cases")
flags.DEFINE_list("packed", ["300", "4000", "1500", "800", "3100", "600", "2200", "1200"],
                  "prompt lengths of the packed case (empty: none)")
flags.DEFINE_list("dtypes", ["bfloat16", "float32"], "activation dtypes")
flags.DEFINE_enum("backend", "pallas", ["pallas", "interpret"], "kernel backend")
flags.DEFINE_string("out", None, "write the results as JSON here")
FLAGS = flags.FLAGS


def _case(cfg, dtype, S, T, R, tiles, packed):
  """(temp bytes, compile seconds, plan) of one compiled prefill of S sequences in T flat
  rows."""
  sds = jax.ShapeDtypeStruct
  if packed:                     # the padded shapes, xbc and dt as T flat rows
    params, state, args = dispatch.abstract_call_args(cfg, S, 1, dtype=dtype)
    args = args._replace(xbc=sds((T, cfg.conv_dim), dtype), dt=sds((T, cfg.nheads), dtype),
                         num_rows=None)
    fn = lambda p, s, a, cu: dispatch.packed(p, s, a, cu, cfg=cfg, backend=FLAGS.backend,
                                             chunk_tiles=tiles)
    lowered = jax.jit(fn, donate_argnums=(1,)).lower(params, state, args, sds((S + 1,),
                                                                               jnp.int32))
  else:
    params, state, args = dispatch.abstract_call_args(cfg, S, R, dtype=dtype)
    fn = lambda p, s, a: dispatch.call(p, s, a, cfg=cfg, backend=FLAGS.backend, chunked=True,
                                       ragged=False, chunk_tiles=tiles)
    lowered = jax.jit(fn, donate_argnums=(1,)).lower(params, state, args)
  t0 = time.perf_counter()
  compiled = lowered.compile()
  seconds = time.perf_counter() - t0
  plan = dispatch.chunk_plan(cfg, FLAGS.backend, state, T, S, dtype, False, R - cfg.capacity,
                             tiles)
  return compiled.memory_analysis().temp_size_in_bytes, seconds, plan


def main(argv):
  del argv
  cfg = m.BOLT
  rows = []
  cases = [(1, int(r), int(r), False) for r in FLAGS.lengths]
  if FLAGS.packed:
    lengths = [int(n) for n in FLAGS.packed]
    cases.append((len(lengths), sum(lengths), sum(lengths), True))
  for name in FLAGS.dtypes:
    dtype = jnp.dtype(name)
    table = m.chunk_tile_config(cfg, cfg.prefill_precision_for(dtype), dtype)
    for S, T, R, packed in cases:
      for tiles in (table, dataclasses.replace(table, scratch_mb=0)):
        temp, seconds, plan = _case(cfg, dtype, S, T, R, tiles, packed)
        rows.append(dict(dtype=name, S=S, T=T, packed=packed, scratch_mb=tiles.scratch_mb,
                         segments=len(plan.segments), segment_slots=plan.segment_slots,
                         scratch_bytes=chunk_scan.scratch_bytes(plan), xla_temp_bytes=temp,
                         compile_s=round(seconds, 2)))
        print(json.dumps(rows[-1]), flush=True)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(dict(device=str(jax.devices()[0].device_kind), backend=FLAGS.backend,
                     rows=rows), f, indent=1)


if __name__ == "__main__":
  app.run(main)

"""Runs one verify configuration (or, with --prefill, one prefill) over and over, for a profiler
(`ncu`) to look at.

Warms up (compiles) first, then runs `--calls` calls, each a separate dispatch, on one state
pool; every call starts from its pool's committed rows. With ncu, skip the warm-up launches:

    ncu --clock-control none --kernel-name regex:m2v_ssm --launch-skip 4 --launch-count 1 \\
        --set full -o /tmp/ssm python tools/profile_call.py --mode=compact --batch=128
    ncu --clock-control none --kernel-name regex:m2v_chunk --launch-skip 4 --launch-count 4 \\
        python tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=4096
    ncu --clock-control none --kernel-name regex:m2v_ssm --launch-skip 1 --launch-count 1 \\
        python tools/profile_call.py --prefill --nochunked --mode=snapshot --batch=1 --rows=37
    ncu --clock-control none --kernel-name regex:m2v_chunk_fused --launch-skip 0 --launch-count 1 \\
        python tools/profile_call.py --mode=snapshot --packed=300,4000,1500,800
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import m2v_jax as m
from m2v_jax import dispatch, status

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "compact", ["snapshot", "compact"], "replay mode")
flags.DEFINE_integer("batch", 128, "sequences B")
flags.DEFINE_integer("rows", 8, "rows R per call")
flags.DEFINE_integer("calls", 6, "calls after the warm-up")
flags.DEFINE_integer("state_row", None, "every sequence's state_row (default: b % rows, mixed)")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "activation dtype")
flags.DEFINE_enum("state_dtype", "float32", ["bfloat16", "float16", "float32"],
                  "SSM state storage dtype")
flags.DEFINE_integer("window", None, "compact mode: deferred-commit window W")
flags.DEFINE_integer("capacity", None, "capacity (default: Bolt's, 8)")
flags.DEFINE_bool("tree", False, "every call verifies one random draft tree "
                  "(each row's parent drawn among the rows before it)")
flags.DEFINE_string("tiles", None, "verify tiles block_p:num_warps:n_cols[:num_stages], then "
                    "any TileConfig field as :name=value, instead of the table's")


flags.DEFINE_bool("z", False, "gated calls: z given (random, the activation dtype)")
flags.DEFINE_bool("prefill", False, "a prefill of --rows rows instead of a verify call")
flags.DEFINE_bool("chunked", True, "with --prefill: the chunked path (--nochunked: the verify "
                  "launches, the body in segments of TileConfig.body_rows rows)")
flags.DEFINE_string("chunk_tiles", None, "with --prefill: tiles.ChunkTiles as from_text "
                    "reads them, instead of the table's")
flags.DEFINE_list("packed", None, "a packed prefill (`prefill_packed`) of prompts of these "
                  "lengths, one pool entry each, instead (--batch and --rows unused)")
flags.DEFINE_enum("precision", None, ["highest", "tf32", "bf16"],
                  "with --prefill or --packed: the product precision (default: by the activation dtype)")


def main(argv):
  del argv
  try:
    backend = m.resolve_backend(None)
  except ValueError as err:
    sys.exit(f"profile_call.py: {err}")
  if backend != "pallas":
    sys.exit("profile_call.py: profiles the compiled kernels: needs a GPU "
             f"(the backend here is {backend!r})")
  cfg = m.BOLT.replace(replay_mode=FLAGS.mode, capacity=FLAGS.capacity or m.BOLT.capacity,
                       window=FLAGS.window if FLAGS.mode == "compact" else None)
  B, R, dtype = FLAGS.batch, FLAGS.rows, jnp.dtype(FLAGS.dtype)
  lengths = [int(n) for n in FLAGS.packed or ()]
  if lengths:
    if FLAGS.tree or FLAGS.tiles or FLAGS.chunk_tiles or FLAGS.prefill or FLAGS.z:
      raise app.UsageError("--packed: a packed prefill on the table's tiles, no other flag")
    B, R = len(lengths), sum(lengths)
  rng = np.random.default_rng(0)
  params = m.random_params(cfg)
  state = m.init_state(cfg, B, dtype, state_dtype=FLAGS.state_dtype)
  rows_of = 1 if lengths else B        # packed: one flat [T, ...] array
  xbc = jnp.asarray(rng.normal(size=(rows_of, R, cfg.conv_dim)), dtype)
  dt = jnp.asarray(rng.normal(-1.0, 1.0, size=(rows_of, R, cfg.nheads)), dtype)
  z = jnp.asarray(rng.normal(size=(B, R, cfg.d_inner)), dtype) if FLAGS.z else None
  rows = jnp.asarray(np.arange(B) % R if FLAGS.state_row is None     # mixed acceptance
                     else np.full(B, FLAGS.state_row), jnp.int32)
  tiles = m.tile_config(cfg, B, R, dtype)
  if FLAGS.tiles:
    tiles = tiles.replace_from_text(FLAGS.tiles)
  ci, nr = jnp.arange(B, dtype=jnp.int32), jnp.full((B,), R, jnp.int32)
  if lengths:
    cfg = cfg.replace(prefill_precision=FLAGS.precision)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    step = jax.jit(lambda s, cu: m.prefill_packed(cfg, params, s, xbc[0], dt[0], cu),
                   donate_argnums=0)
    for _ in range(FLAGS.calls + 1):
      y, state = step(state, cu)
    jax.block_until_ready((y, state))
    print(f"{FLAGS.calls + 1} packed prefills of {cfg.replay_mode} "
          f"n={','.join(map(str, lengths))} done")
    return
  if FLAGS.prefill:
    cfg = cfg.replace(prefill_precision=FLAGS.precision)
    ct = m.ChunkTiles.from_text(FLAGS.chunk_tiles) if FLAGS.chunk_tiles else None
    step = jax.jit(lambda s: m.prefill(cfg, params, s, xbc, dt, jnp.zeros((B,), jnp.int32),
                                       z=z, chunked=FLAGS.chunked, chunk_tiles=ct),
                   donate_argnums=0)
    for _ in range(FLAGS.calls + 1):
      y, state = step(state)
    jax.block_until_ready((y, state))
    path = "chunked" if FLAGS.chunked else "unchunked"
    print(f"{FLAGS.calls + 1} {path} prefills of {cfg.replay_mode} B={B} R={R} done")
    return
  parents = None
  if FLAGS.tree:
    par = np.floor(rng.random((B, R)) * np.maximum(np.arange(R), 1)).astype(np.int32)
    par[:, 0] = -1
    parents = jnp.asarray(par)
  # The index arrays are arguments (closed over, XLA rebuilds them with a kernel each call).
  step = jax.jit(lambda s, r, ci, nr, par: dispatch.kernel_call(
      cfg, backend, params, s, status.call_args(xbc, dt, r, z, ci, nr), tiles,
      parents=par), donate_argnums=0)
  _, state = step(state, jnp.zeros((B,), jnp.int32), ci, nr, parents)   # warm-up
  for _ in range(FLAGS.calls):
    y, state = step(state, rows, ci, nr, parents)
  jax.block_until_ready((y, state))
  print(f"{FLAGS.calls} calls of {cfg.replay_mode} B={B} R={R}{' tree' if FLAGS.tree else ''} done; y finite: "
        f"{bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))}")


if __name__ == "__main__":
  app.run(main)

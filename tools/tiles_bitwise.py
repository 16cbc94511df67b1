"""Whether verify calls give bitwise the same y and state under other tiles as under the first,
or as another tree's saved run.

Runs the same `--calls` verify calls (random state_row after the first) under each of `--tiles`
and compares y and every state leaf, byte for byte, with the first tiles' run (`--save` writes
that run, `--against` compares it with a saved one). Compiled on a GPU; elsewhere interpreted
(`--geometry=small`), where tiles change nothing:

    python tools/tiles_bitwise.py --tiles=64:4:64,16:2:64 --modes=compact,snapshot
    python tools/tiles_bitwise.py --tiles=64:4:64,64:4:64:touch=1 --modes=compact --window=32
    python tools/tiles_bitwise.py --tiles=64:4:64 --state_dtype=bfloat16 --save=/tmp/a.npz
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import m2v_jax as m
from m2v_jax import dispatch, status

FLAGS = flags.FLAGS
flags.DEFINE_list("tiles", None, "tile texts (`TileConfig.replace_from_text`), the first the "
                  "baseline", required=True)
flags.DEFINE_list("modes", ["compact", "snapshot"], "replay modes")
flags.DEFINE_integer("window", None, "compact mode: deferred-commit window W")
flags.DEFINE_integer("batch", 3, "sequences B")
flags.DEFINE_integer("calls", 5, "verify calls of capacity rows")
flags.DEFINE_enum("geometry", "bolt", ["bolt", "small"], "bolt, or a small one for a CPU run")
flags.DEFINE_enum("state_dtype", "float32", ["float32", "bfloat16", "float16"],
                  "SSM state storage dtype")
flags.DEFINE_string("save", None, "write the first tiles' runs here (.npz)")
flags.DEFINE_string("against", None, "compare the first tiles' runs with this saved file")


def run(cfg, backend, tiles, B, calls, state_dtype):
  """y of the last call and every state leaf, as numpy arrays, after `calls` calls."""
  p, R = m.random_params(cfg), cfg.capacity
  state = m.init_state(cfg, B, jnp.bfloat16, state_dtype=state_dtype)
  rng = np.random.default_rng(1)
  for k in range(calls):
    xbc = jnp.asarray(rng.normal(size=(B, R, cfg.conv_dim)), jnp.bfloat16)
    dt = jnp.asarray(rng.normal(-1, 1, size=(B, R, cfg.nheads)), jnp.bfloat16)
    rows = jnp.asarray(rng.integers(0, R, B) if k else np.zeros(B), jnp.int32)
    y, state = dispatch.kernel_call(cfg, backend, p, state, status.call_args(xbc, dt, rows),
                                    tiles)
  return [np.asarray(y)] + [np.asarray(leaf) for leaf in state]


def main(argv):
  del argv
  backend = "pallas" if m.resolve_backend(None) == "pallas" else "interpret"
  geometry = m.BOLT if FLAGS.geometry == "bolt" else m.Mamba2Config(nheads=4, headdim=64,
                                                                    dstate=64, ngroups=2)
  same_bytes = lambda a, b: np.array_equal(a.view(np.uint8), b.view(np.uint8))
  setup = (f"{FLAGS.geometry} {FLAGS.modes} W={FLAGS.window} B={FLAGS.batch} "
           f"calls={FLAGS.calls} state={FLAGS.state_dtype} tiles={FLAGS.tiles[0]}")
  saved, theirs = {"setup": np.array(setup)}, np.load(FLAGS.against) if FLAGS.against else None
  if theirs is not None and str(theirs["setup"]) != setup:
    raise SystemExit(f"{FLAGS.against} holds runs of {theirs['setup']}, not {setup}")
  for mode in FLAGS.modes:
    cfg = geometry.replace(replay_mode=mode,
                           window=FLAGS.window if mode == "compact" else None)
    runs = [run(cfg, backend, m.tile_config(cfg).replace_from_text(t), FLAGS.batch,
                FLAGS.calls, jnp.dtype(FLAGS.state_dtype)) for t in FLAGS.tiles]
    for text, got in zip(FLAGS.tiles[1:], runs[1:]):
      same = [same_bytes(a, b) for a, b in zip(runs[0], got)]
      print(f"{mode} W={FLAGS.window} {text} vs {FLAGS.tiles[0]} ({backend}): y bitwise "
            f"{same[0]}, state leaves bitwise {same[1:]}")
    saved.update({f"{mode}_{i}": a for i, a in enumerate(runs[0])})
    if theirs is not None:
      same = [same_bytes(a, theirs[f"{mode}_{i}"]) for i, a in enumerate(runs[0])]
      print(f"{mode} W={FLAGS.window} state {FLAGS.state_dtype} {FLAGS.tiles[0]} vs "
            f"{FLAGS.against}: y bitwise {same[0]}, state leaves bitwise {same[1:]}")
  if FLAGS.save:
    np.savez(FLAGS.save, **saved)


if __name__ == "__main__":
  app.run(main)

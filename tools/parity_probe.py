"""The two modes side by side on one call sequence, with the first differing y and state
elements printed: a quick look at a bitwise-parity failure on a GPU.

    python tools/parity_probe.py --state_dtype=float16 --window=32
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import m2v_jax as m

FLAGS = flags.FLAGS
flags.DEFINE_enum("state_dtype", "float16", ["float32", "bfloat16", "float16"], "state storage")
flags.DEFINE_integer("window", None, "compact deferred-commit window")
flags.DEFINE_integer("rows", 20, "rows of the first call (a prefill when above 8)")
flags.DEFINE_integer("repeats", 2, "runs of each mode (a run-to-run difference is a race)")
flags.DEFINE_string("backend", None, "backend (default: pallas on a GPU)")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "activation dtype")


def run(cfg, p, xbc, dt):
  state = m.init_state(cfg, xbc.shape[0], xbc.dtype, state_dtype=FLAGS.state_dtype)
  fn = m.prefill if xbc.shape[1] > cfg.capacity else m.verify
  y, state = fn(cfg, p, state, xbc, dt, np.zeros(xbc.shape[0], np.int32), backend=FLAGS.backend)
  return np.asarray(y.astype(jnp.float32)), np.asarray(state.ssm.astype(jnp.float32))


def main(argv):
  del argv
  snap = m.Mamba2Config(nheads=4, headdim=8, dstate=16, ngroups=2, window=FLAGS.window)
  p = m.random_params(snap, 32)
  rng = np.random.default_rng(32)
  B, R = 3, FLAGS.rows
  xbc = jnp.asarray(rng.normal(size=(B, R, snap.conv_dim)), FLAGS.dtype)
  dt = jnp.asarray(rng.normal(-0.5, 1.5, size=(B, R, snap.nheads)), FLAGS.dtype)
  out = {}
  for mode in ("snapshot", "compact"):
    runs = [run(snap.replace(replay_mode=mode), p, xbc, dt) for _ in range(FLAGS.repeats)]
    for k, (y, _) in enumerate(runs[1:], 1):
      print(f"{mode}: run {k} vs run 0, y elements differing: {np.count_nonzero(y != runs[0][0])}")
    out[mode] = runs[0]
  ys, yc = out["snapshot"][0], out["compact"][0]
  diff = np.argwhere(ys != yc)
  print(f"y: {len(diff)} of {ys.size} elements differ between the modes"
        + (f"; first {diff[:6].tolist()} (sequence, row, channel)" if len(diff) else ""))
  for row in sorted({int(d[1]) for d in diff})[:8]:
    print(f"  row {row}: {np.count_nonzero(ys[:, row] != yc[:, row])} differ, max "
          f"|diff| {np.max(np.abs(ys[:, row] - yc[:, row])):.3e}")


if __name__ == "__main__":
  app.run(main)

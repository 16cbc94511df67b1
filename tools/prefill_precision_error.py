"""Error of the chunked prefill at each product precision against a float64 oracle.

One prefill of R rows (B=1, snapshot mode, from a random starting state, no gate) at each
`Mamba2Config.prefill_precision` ("highest", "tf32", "bf16") and activation dtype, compiled
on the GPU (or in interpret mode), against the same math in float64 NumPy: the post-conv rows
and processed dt as the kernels take them (the conv output rounded to the activation dtype,
docs/semantics.md), then the SSM in float64 (a chunked evaluation; its own rounding, ~1e-15,
does not show). Reported per case, as JSON: the relative error (Frobenius norm) of the final
state and of y, y's error floor (the float64 y rounded to the activation dtype: what storing
y costs by itself), and the same errors of the verify kernels (the last `capacity` rows of
every prefill run through them; `chunked=False` runs them all so).

    python tools/prefill_precision_error.py --out=$OUT/prefill_precision.json   # on a GPU
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import m2v_jax as m
from m2v_jax import reference
from m2v_jax.kernels import rowmath

flags.DEFINE_list("lengths", ["512", "4096"], "prefill rows R")
flags.DEFINE_list("dtypes", ["bfloat16", "float32"], "activation dtypes")
flags.DEFINE_enum("backend", "pallas", ["pallas", "interpret"], "kernel backend")
flags.DEFINE_enum("geometry", "bolt", ["bolt", "small"], "layer geometry")
flags.DEFINE_string("out", None, "write the results as JSON here")
FLAGS = flags.FLAGS


def oracle(cfg, p, ssm0, post, dtp, L=64):
  """float64 SSM over post-conv rows post [R, C] and processed dt [R, H] from ssm0 [H, P, N]:
  (y [R, H*P], final state [H, P, N]), chunk by chunk (Mamba-2 paper, §6)."""
  H, P, N, G = cfg.nheads, cfg.headdim, cfg.dstate, cfg.ngroups
  R = post.shape[0]
  x = post[:, :H * P].reshape(R, H, P)
  Bm = post[:, H * P:H * P + G * N].reshape(R, G, N)
  Cm = post[:, H * P + G * N:].reshape(R, G, N)
  hg = np.arange(H) // (H // G)
  A = -np.exp(np.asarray(p.A_log, np.float64))
  D = np.asarray(p.D, np.float64)
  st = ssm0.copy()
  ys = []
  for c0 in range(0, R, L):
    s = slice(c0, min(c0 + L, R))
    xc, dc, bc, cc = x[s], dtp[s], Bm[s][:, hg], Cm[s][:, hg]          # [l, H, ...]
    acum = np.cumsum(dc * A, axis=0)                                    # [l, H]
    seg = acum[:, None, :] - acum[None, :, :]                           # [t, s, H]
    causal = np.tril(np.ones((len(dc), len(dc)), bool))[:, :, None]
    w = np.where(causal, np.exp(np.where(causal, seg, 0.0)), 0.0) * dc[None, :, :]
    cb = np.einsum("thn,shn->tsh", cc, bc)
    y = np.einsum("tsh,shp->thp", cb * w, xc)
    y += np.exp(acum)[:, :, None] * np.einsum("thn,hpn->thp", cc, st)
    y += D[None, :, None] * xc
    ys.append(y.reshape(len(dc), H * P))
    decay = np.exp(acum[-1][None, :] - acum) * dc                       # [l, H]
    st = np.exp(acum[-1])[:, None, None] * st + np.einsum("sh,shp,shn->hpn", decay, xc, bc)
  return np.concatenate(ys), st


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(argv):
  del argv
  base = m.BOLT if FLAGS.geometry == "bolt" else m.Mamba2Config(nheads=8, headdim=16,
                                                                   dstate=32, ngroups=2)
  p = m.random_params(base, 1)
  out = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__,
             geometry=FLAGS.geometry, rows=[])
  for R in map(int, FLAGS.lengths):
    rng = np.random.default_rng(R)
    raw_x = rng.normal(size=(1, R, base.conv_dim))
    raw_dt = rng.normal(-0.5, 1.5, size=(1, R, base.nheads))
    ssm0 = rng.normal(0, 0.5, size=(base.nheads, base.headdim, base.dstate)).astype(np.float32)
    for dname in FLAGS.dtypes:
      dtype = jnp.dtype(dname)
      xbc, dt = jnp.asarray(raw_x, dtype), jnp.asarray(raw_dt, dtype)
      conv0 = jnp.zeros((1, base.conv_dim, base.d_conv - 1), dtype)
      post, _ = reference.conv_prefill(base.replace(), p, conv0, xbc)
      post = post.astype(dtype).astype(jnp.float32)                     # the rounding of §2.1
      dtp = rowmath.process_dt(dt.astype(jnp.float32), p.dt_bias, base.dt_limit)
      y64, st64 = oracle(base, p, ssm0.astype(np.float64), np.asarray(post[0], np.float64),
                         np.asarray(dtp[0], np.float64))
      y_floor = rel(np.asarray(jnp.asarray(y64, jnp.float32).astype(dtype), np.float64), y64)
      for prec, chunked in [("highest", True), ("tf32", True), ("bf16", True), (None, False)]:
        cfg = base.replace(prefill_precision=prec)
        state = m.init_state(cfg, 1, dtype)
        state = state._replace(ssm=state.ssm.at[0, 0].set(jnp.asarray(ssm0)))
        y, state = m.prefill(cfg, p, state, xbc, dt, [0], backend=FLAGS.backend,
                             chunked=chunked)
        final = state.ssm[0, cfg.capacity - 1]
        row = dict(R=R, dtype=dname, precision=prec if chunked else "serial kernels",
                   state_rel_err=rel(final, st64), y_rel_err=rel(y[0], y64),
                   y_floor=y_floor)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  app.run(main)

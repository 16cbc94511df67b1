"""Accuracy of 16-bit state storage over a long speculative-decoding run.

A 256-step decode loop at a chosen geometry (default Bolt), B sequences, R=8 rows a call,
the accepted drafts of every call drawn as the benchmarks draw them (`benchmarks/bench.py`:
a draft is accepted with probability 0.78 while every earlier one was). The same inputs and
`state_row`s run with float32, bfloat16 and float16 state storage, and through a float64
NumPy oracle of the same math (docs/semantics.md, "One row") without any rounding. Reported
per storage dtype: the relative error (Frobenius norm over the call, per sequence) of every
call's y and of the final committed state, against the float32-state run and against the
oracle (median and maximum over the calls), as JSON.

    python tools/state_dtype_drift.py --backend=reference --out=/tmp/drift.json
    python tools/state_dtype_drift.py --backend=pallas --out=$OUT/drift.json   # on a GPU

Activations are float32 here, so that the differences come from the state's storage alone.
Snapshot mode only: compact mode gives bitwise the same values (tests/test_state_dtype.py).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import m2v_jax as m
from m2v_jax import config as config_lib

flags.DEFINE_enum("backend", "reference", list(config_lib.BACKENDS), "kernel backend")
flags.DEFINE_integer("steps", 256, "verify calls")
flags.DEFINE_integer("batch", 2, "sequences")
flags.DEFINE_enum("geometry", "bolt", ["bolt", "small"], "layer geometry")
flags.DEFINE_string("out", None, "write the results as JSON here")
FLAGS = flags.FLAGS

ACCEPT_PROB = 0.78
R = 8


def oracle_call(cfg, p, st, win, xbc, dt):
  """Rows 0..R-1 from (st [B, H, P, N], win [B, K-1, C]) in float64: (y [B, R, H*P],
  states [B, R, H, P, N], windows [B, R, K-1, C])."""
  H, P, N, G = cfg.nheads, cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  w = np.asarray(p.conv_weight, np.float64)                       # [C, K]
  cb, dtb = np.asarray(p.conv_bias, np.float64), np.asarray(p.dt_bias, np.float64)
  A = -np.exp(np.asarray(p.A_log, np.float64))
  D = np.asarray(p.D, np.float64)
  ys, states, wins = [], [], []
  for r in range(xbc.shape[1]):
    v = xbc[:, r].astype(np.float64)
    full = np.concatenate([win, v[:, None]], axis=1)              # [B, K, C]
    acc = np.einsum("bkc,ck->bc", full, w) + cb
    out = acc / (1 + np.exp(-acc))
    x = out[:, :HP].reshape(-1, H, P)
    bm = np.repeat(out[:, HP:HP + GN].reshape(-1, G, N), H // G, axis=1)
    cm = np.repeat(out[:, HP + GN:].reshape(-1, G, N), H // G, axis=1)
    d = dt[:, r].astype(np.float64) + dtb
    d = np.where(d <= 20, np.log1p(np.exp(np.minimum(d, 20))), d)
    dA = np.exp(d * A)
    st = st * dA[..., None, None] + (d[..., None] * x)[..., None] * bm[:, :, None, :]
    y = np.einsum("bhpn,bhn->bhp", st, cm) + D[:, None] * x
    win = full[:, 1:]
    ys.append(y.reshape(-1, HP))
    states.append(st)
    wins.append(win)
  return np.stack(ys, 1), np.stack(states, 1), np.stack(wins, 1)


def rel(a, b, axes):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.sqrt(np.sum((a - b) ** 2, axes) / np.maximum(np.sum(b ** 2, axes), 1e-300))


def main(_):
  cfg = m.BOLT if FLAGS.geometry == "bolt" else m.Mamba2Config(nheads=8, headdim=16, dstate=32,
                                                               ngroups=2)
  B, steps = FLAGS.batch, FLAGS.steps
  p = m.random_params(cfg, 0)
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(B, R, cfg.conv_dim)).astype(np.float32) for _ in range(steps)]
  dts = [rng.normal(-0.5, 1.5, size=(B, R, cfg.nheads)).astype(np.float32) for _ in range(steps)]
  accepted = np.minimum(rng.geometric(1 - ACCEPT_PROB, (steps, B)) - 1, R - 1).astype(np.int32)

  dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
  runs = {}
  for name, sdt in dtypes.items():
    state = m.init_state(cfg, B, jnp.float32, state_dtype=sdt)
    rows = np.zeros(B, np.int32)
    ys = []
    for t in range(steps):
      y, state = m.verify(cfg, p, state, jnp.asarray(xs[t]), jnp.asarray(dts[t]), rows,
                          backend=FLAGS.backend)
      ys.append(np.asarray(y))
      rows = accepted[t]
    ssm, _ = m.committed_state(cfg, p, state, rows, backend=FLAGS.backend)
    runs[name] = (ys, np.asarray(ssm))
    print(f"{name}: done", flush=True)

  st = np.zeros((B, cfg.nheads, cfg.headdim, cfg.dstate))
  win = np.zeros((B, cfg.d_conv - 1, cfg.conv_dim))
  oracle_ys = []
  for t in range(steps):
    y, states, wins = oracle_call(cfg, p, st, win, xs[t], dts[t])
    oracle_ys.append(y)
    st, win = states[np.arange(B), accepted[t]], wins[np.arange(B), accepted[t]]

  def summary(errs):
    e = np.asarray(errs)
    return {"median": float(np.median(e)), "max": float(np.max(e))}

  results = {"meta": {"geometry": FLAGS.geometry, "backend": FLAGS.backend, "steps": steps,
                      "batch": B, "rows": R, "accept_prob": ACCEPT_PROB,
                      "mean_accepted_drafts": float(accepted.mean()),
                      "jax": jax.__version__, "device": str(jax.devices()[0])}}
  for name, (ys, ssm) in runs.items():
    results[name] = {
        "y_vs_float64": summary([rel(a, b, (1, 2)) for a, b in zip(ys, oracle_ys)]),
        "y_vs_float32_state": summary([rel(a, b, (1, 2)) for a, b in zip(ys, runs["float32"][0])]),
        "y_last_call_vs_float64": float(np.max(rel(ys[-1], oracle_ys[-1], (1, 2)))),
        "state_vs_float64": float(np.max(rel(ssm, st, (1, 2, 3)))),
        "state_vs_float32_state": float(np.max(rel(ssm, runs["float32"][1], (1, 2, 3)))),
    }
  text = json.dumps(results, indent=1)
  print(text)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  app.run(main)

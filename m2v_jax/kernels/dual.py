"""y of a segment of rows in the SSD dual form, for one (sequence, head), written once.

A segment is up to `KT` consecutive rows that start from one state S (a call's new rows,
or `capacity` rows of a long prefill's body). Its rows come as tiles: x [KT, BP] (BP of the
head's P rows), B and C as chunks [KT, NC] of the group's N columns, processed dt [KT], and
`valid` [KT] marks the real rows. The state S is a list of chunks [BP, NC]. With
a_k = dt_k A and cum the running sum of a over the segment:

  y_t = exp(cum_t) (C_t . S) + sum_{k <= t} (B_k . C_t) dt_k exp(cum_t - cum_k) x_k + D x_t

(Dao & Gu, "Transformers are SSMs", 2024: the SSD dual form of the Mamba-2 recurrence.) The
products go through a `Products` of the caller: the kernels' float32-accurate tensor-core
products (`kernels.backend.Products`), or the reference's float32 einsums.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

f32 = jnp.float32


def tile_rows(capacity: int) -> int:
  """KT, the rows of a segment tile: the capacity rounded up to a power of two, at least 8
  (the smallest tensor-core product)."""
  return max(8, 1 << (capacity - 1).bit_length())


def _iota(n, dim=0, shape=None):
  return lax.broadcasted_iota(jnp.int32, shape or (n,), dim)


def log_decay(a_rows, KT):
  """cum [KT]: the running sum of the rows' log decays `a_rows` (scalars a_k = dt_k A, zero
  for rows that do not count), added one after another in row order: a fixed order whatever
  a tile's layout, so that every kernel sums alike. Rows past the list hold the total."""
  idx = _iota(KT)
  run, cum = jnp.float32(0.0), jnp.zeros((KT,), f32)
  for k, a_k in enumerate(a_rows):
    run = run + a_k
    cum = jnp.where(idx == k, run, cum)
  return jnp.where(idx < len(a_rows), cum, run)


def outputs(S, x, b, c, dt, A, D, valid, mm, cum=None):
  """y of every row of the segment from its start state S, without the gate.

  Args:
    S: the state before the segment, chunks [BP, NC] float32.
    x: [KT, BP] x rows (float32 holding activation-dtype values).
    b, c: B and C rows, chunks [KT, NC] (the same).
    dt: [KT] processed dt, float32.
    A, D: the head's A = -exp(A_log) and D.
    valid: [KT] bool, the segment's real rows.
    mm: `Products`.
    cum: `log_decay` of the rows when the caller has it (the kernels sum scalar loads);
      else it is summed here from `dt`.

  Returns:
    y [BP, KT] float32 (column t: row t); rows that are not `valid` hold values to drop.
  """
  KT = x.shape[0]
  if cum is None:
    a = jnp.where(valid, dt * A, 0.0)
    cum = log_decay([jnp.sum(jnp.where(_iota(KT) == k, a, 0.0)) for k in range(KT)], KT)
  k, t = _iota(KT, 0, (KT, KT)), _iota(KT, 1, (KT, KT))
  causal = (k <= t) & valid[:, None]
  xk = jnp.where(valid[:, None], x, 0.0)
  cb = sc = None
  for s, bc, cc in zip(S, b, c):
    cc = jnp.where(valid[:, None], cc, 0.0)
    cb = mm.exact(jnp.where(valid[:, None], bc, 0.0), cc, acc=cb)      # [k, t]
    sc = mm.state(s, cc, acc=sc)                                      # [BP, t]
  decay = jnp.exp(cum[None, :] - cum[:, None])                        # [k, t]
  m = jnp.where(causal, cb * dt[:, None] * decay, 0.0)                 # [k, t]
  return mm.rows_t(xk, m, acc=jnp.exp(cum)[None, :] * sc + D * xk.T)

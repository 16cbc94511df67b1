"""SSD dual form of one segment of rows of one (sequence, head), written once.

A segment is up to `KT` consecutive rows that start from one state S: a call's new rows, or
the rows of one earlier call that a compact fold replays. Its rows come as tiles: x [KT, BP]
(BP of the head's P rows), B and C as chunks [KT, NC] of the group's N columns, processed dt
[KT], with `valid` [KT] marking the real rows. The state S is a list of chunks [BP, NC].
With a_k = dt_k A and cum the running sum of a over the segment:

  state after row r:  S_r = exp(cum_r) S + sum_{k <= r} (x_k)^T (dt_k exp(cum_r - cum_k) B_k)
  y of row t:         y_t = exp(cum_t) (C_t . S) + sum_{k <= t} (B_k . C_t) dt_k
                            exp(cum_t - cum_k) x_k + D x_t

(Dao & Gu, "Transformers are SSMs", 2024, the SSD dual form of the Mamba-2 recurrence.) The
products go through a `Products` of the caller: the kernels' float32-accurate tensor-core
products (`kernels.backend.Products`), or the reference's float32 einsums. Every function
takes its operands from the rows it needs only, masked with selects (not products), so two
calls that hold the same rows compute bitwise the same result whatever else their tiles
hold: that is what keeps snapshot slots and compact folds identical.
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


def _pick(v, i):
  """Element i (traced scalar) of the vector v, exactly (a select and a sum of zeros)."""
  return jnp.sum(jnp.where(_iota(v.shape[0]) == i, v, 0.0))


def fold(S, x, b, dt, A, valid, r, mm):
  """The state after row r of the segment (r a traced scalar; rows past r do not enter).

  Args:
    S: the state before the segment, chunks [BP, NC] float32.
    x: [KT, BP] x rows (float32 holding activation-dtype values).
    b: B rows, chunks [KT, NC] (the same).
    dt: [KT] processed dt, float32.
    A: the head's A = -exp(A_log).
    valid: [KT] bool, the segment's real rows (rows past r are dropped as well).
    r: the last row folded.
    mm: `Products`.

  Returns:
    The state after row r, chunks [BP, NC] float32.
  """
  KT = x.shape[0]
  keep = valid & (_iota(KT) <= r)
  a = jnp.where(keep, dt * A, 0.0)
  cum = jnp.cumsum(a)
  cum_r = _pick(cum, r)
  w = jnp.where(keep, dt * jnp.exp(cum_r - cum), 0.0)                 # [KT]
  xk = jnp.where(keep[:, None], x, 0.0)
  decay = jnp.exp(cum_r)
  return [mm.rows_t(xk, jnp.where(keep[:, None], w[:, None] * bc, 0.0), acc=decay * s)
          for s, bc in zip(S, b)]


def outputs(S, x, b, c, dt, A, D, valid, mm):
  """y of every row of the segment from its start state S, without the gate.

  Args:
    S, x, b, dt, A, valid, mm: as `fold`.
    c: C rows, chunks [KT, NC].
    D: the head's D.

  Returns:
    y [BP, KT] float32 (column t: row t); rows that are not `valid` hold values to be
    dropped.
  """
  KT = x.shape[0]
  a = jnp.where(valid, dt * A, 0.0)
  cum = jnp.cumsum(a)
  k, t = _iota(KT, 0, (KT, KT)), _iota(KT, 1, (KT, KT))
  causal = (k <= t) & valid[:, None]
  xk = jnp.where(valid[:, None], x, 0.0)
  cb = sc = None
  for s, bc, cc in zip(S, b, c):
    bc = jnp.where(valid[:, None], bc, 0.0)
    cc = jnp.where(valid[:, None], cc, 0.0)
    cb = mm.exact(bc, cc, acc=cb)                                     # [k, t]
    sc = mm.state(s, cc, acc=sc)                                      # [BP, t]
  decay = jnp.exp(cum[None, :] - cum[:, None])                        # [k, t]
  m = jnp.where(causal, cb * dt[:, None] * decay, 0.0)                 # [k, t]
  return mm.rows_t(xk, m, acc=jnp.exp(cum)[None, :] * sc + D * xk.T)

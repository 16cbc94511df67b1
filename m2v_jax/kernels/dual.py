"""y of a segment of rows in the SSD dual form, one (sequence, head); kernels and reference.

With cum the running sum of dt_k A over the segment and S its start state (Dao & Gu, 2024):
  y_t = exp(cum_t) (C_t . S) + sum_{k <= t} (B_k . C_t) dt_k exp(cum_t - cum_k) x_k + D x_t
In a draft tree the sums run over row t's ancestors and itself instead of k <= t.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from m2v_jax.kernels import tiles as tiles_lib

f32 = jnp.float32


def tile_rows(capacity: int) -> int:
  """KT: the capacity rounded up to a power of two, at least 8 (the smallest tensor-core dot)."""
  return max(8, tiles_lib.next_pow2(capacity))


def _iota(n, dim=0, shape=None):
  return lax.broadcasted_iota(jnp.int32, shape or (n,), dim)


def log_decay(a_rows, KT):
  """cum [KT]: the running sum of `a_rows` in row order (fixed, whatever the tile layout); rows
  past the list hold the total.
  """
  idx = _iota(KT)
  run, cum = jnp.float32(0.0), jnp.zeros((KT,), f32)
  for k, a_k in enumerate(a_rows):
    run = run + a_k
    cum = jnp.where(idx == k, run, cum)
  return jnp.where(idx < len(a_rows), cum, run)


def ancestors(anc_bits, KT):
  """[KT, KT] bool, [k, t] where row k is row t or one of its ancestors, from `anc_bits` [KT]
  int32 (bit k of row t's entry set for each such k; rows from 31 on have none)."""
  k = _iota(KT, 0, (KT, KT))
  return (k < 31) & (((anc_bits[None, :] >> jnp.minimum(k, 30)) & 1) > 0)


def path_decay(a_rows, anc_bits):
  """cum [KT]: for each row t, the sum of `a_rows` over its ancestors and itself (`anc_bits`
  [KT] as in `ancestors`), in row order (a chain's bits give `log_decay`'s sums bit for bit)."""
  cum = jnp.zeros(anc_bits.shape, f32)
  for k, a_k in enumerate(a_rows):
    on = ((anc_bits >> min(k, 30)) & 1) > 0
    cum = cum + jnp.where(on & (k < 31), a_k, 0.0)
  return cum


def outputs(S, x, b, c, dt, A, D, valid, mm, cum=None, held=f32, anc=None):
  """y [BP, KT] of the segment's rows from its start state, ungated (rows not `valid`: to drop).

  Args:
    S: start state, chunks [BP, NC] float32.
    x: [KT, BP]; b, c: chunks [KT, NC] (float32 holding activation-dtype values).
    dt: [KT] processed dt; A, D: the head's scalars.
    valid: [KT] bool, the real rows.
    mm: `backend.Products`.
    cum: `log_decay` of the rows, if the caller has it.
    held: a type S's values are exact in (a stored 16-bit state: fewer product passes).
    anc: [KT, KT] bool, a draft tree's `ancestors` (with `cum` from its `path_decay`); None:
      a chain (k <= t).
  """
  KT = x.shape[0]
  if anc is not None and cum is None:
    raise ValueError("dual.outputs: a tree's `anc` needs its `cum` (dual.path_decay)")
  if cum is None:
    a = jnp.where(valid, dt * A, 0.0)
    cum = log_decay([jnp.sum(jnp.where(_iota(KT) == k, a, 0.0)) for k in range(KT)], KT)
  k, t = _iota(KT, 0, (KT, KT)), _iota(KT, 1, (KT, KT))
  causal = (k <= t if anc is None else anc) & valid[:, None]
  xk = jnp.where(valid[:, None], x, 0.0)
  cb = sc = None
  for s, bc, cc in zip(S, b, c):
    cc = jnp.where(valid[:, None], cc, 0.0)
    cb = mm.exact(jnp.where(valid[:, None], bc, 0.0), cc, acc=cb)      # [k, t]
    sc = mm.state(s, cc, acc=sc, held=held)                           # [BP, t]
  decay = jnp.exp(cum[None, :] - cum[:, None])                        # [k, t]
  m = jnp.where(causal, cb * dt[:, None] * decay, 0.0)                 # [k, t]
  return mm.rows_t(xk, m, acc=jnp.exp(cum)[None, :] * sc + D * xk.T)

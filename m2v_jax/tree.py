"""Draft trees: each row's ancestors (as bits) and its conv window along its path."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from m2v_jax.kernels import rowmath

f32 = jnp.float32

# Rows of a tree call, at most: a row's ancestors are the bits of one int32.
MAX_ROWS = 31


def ancestor_bits(parents):
  """[B, R] int32 `parents` (-1: the root) -> [B, R] int32, bit k of row t set where row k is
  row t or one of its ancestors. Pointer doubling: after round j each row holds its ancestors
  up to 2**j - 1 levels up, so five rounds of gathers cover any tree of MAX_ROWS rows (no
  loop over the rows, which on a GPU costs a launch and a host round trip per row)."""
  parents = jnp.asarray(parents, jnp.int32)
  B, R = parents.shape
  if R > MAX_ROWS:
    raise ValueError(f"parents: a tree call takes at most {MAX_ROWS} rows, got {R}")
  rows = jnp.arange(R, dtype=jnp.int32)
  up = jnp.where(parents < 0, rows[None, :], parents)      # the root points at itself
  bits = jnp.broadcast_to(jnp.int32(1) << rows, (B, R))
  for _ in range(max(R - 1, 0).bit_length()):
    bits = bits | jnp.take_along_axis(bits, up, axis=1)
    up = jnp.take_along_axis(up, up, axis=1)
  return bits


def parent_ok(parents, xp=jnp):
  """[B, R] `parents` -> [B, R] bool: -1 at row 0 (the root), 0 <= parents[b, r] < r after it.
  The one rule: `checks.parents` applies it to host values (xp=numpy), `valid_parents` on the
  device."""
  r = xp.arange(parents.shape[1])[None, :]
  return xp.where(r == 0, parents == -1, (parents >= 0) & (parents < r))


def valid_parents(parents):
  """[B, R] `parents` -> [B] bool: every row keeps `parent_ok`'s rule."""
  return jnp.all(parent_ok(jnp.asarray(parents, jnp.int32)), axis=1)


def from_parent(rows, start, parents):
  """Each sequence's entry of `rows` [B, R, ...] at its row's parent, or `start` [B, ...] where
  the parent is -1: the state (or conv window) a tree row starts from; parents [B]."""
  above = rows[jnp.arange(rows.shape[0]), jnp.maximum(parents, 0)]
  root = (parents < 0).reshape((-1,) + (1,) * (above.ndim - 1))
  return jnp.where(root, start, above)


def conv_rows(cfg, params, conv0, xbc, parents):
  """The causal conv of a tree call, each row over its ancestors' raw inputs.

  Args:
    conv0: [B, C, K-1] conv state before the root; xbc: [B, R, C] raw rows; parents: [B, R].

  Returns:
    post-conv rows [B, R, C] float32 (rounded to xbc's dtype as the conv's output is), and the
    conv window after each row [B, R, C, K-1] float32.
  """
  B, R, C = xbc.shape
  K = cfg.d_conv
  taps = [params.conv_weight[:, k] for k in range(K)]
  parents = jnp.asarray(parents, jnp.int32)
  win0 = jnp.swapaxes(conv0.astype(f32), 1, 2)                        # [B, K-1, C]

  def step(wins, inp):
    t, xb, par = inp
    win = from_parent(wins, win0, par)
    v = xb.astype(f32)
    out = rowmath.conv_output(taps, [win[:, j] for j in range(K - 1)] + [v], params.conv_bias,
                              xbc.dtype)
    return wins.at[:, t].set(jnp.concatenate([win[:, 1:], v[:, None]], axis=1)), out

  ts = jnp.arange(R, dtype=jnp.int32)
  wins, post = lax.scan(step, jnp.zeros((B, R, K - 1, C), f32),
                        (ts, jnp.swapaxes(xbc, 0, 1), jnp.swapaxes(parents, 0, 1)))
  return jnp.swapaxes(post, 0, 1), jnp.swapaxes(wins, 2, 3)

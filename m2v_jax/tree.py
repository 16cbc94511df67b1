"""Draft trees: each row's ancestors (as bits) and its conv window along its path."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from m2v_jax.kernels import rowmath

f32 = jnp.float32

# Rows of a tree call, at most: a row's ancestors are the bits of one int32.
MAX_ROWS = 31


def ancestor_bits(parents):
  """[..., R] int32 `parents` (-1: the root) -> [..., R] int32, bit k of row t set where row k
  is row t or one of its ancestors (`doubled_bits`); raises ValueError past MAX_ROWS rows."""
  parents = jnp.asarray(parents, jnp.int32)
  R = parents.shape[-1]
  if R > MAX_ROWS:
    raise ValueError(f"parents: a tree call takes at most {MAX_ROWS} rows, got {R}")
  return doubled_bits(parents)


def doubled_bits(parents):
  """`ancestor_bits` by pointer doubling, in jax.numpy that the kernels lower too: after
  round j each row holds its ancestors up to 2**j - 1 levels up, so ceil(log2(R)) rounds
  cover any tree; each round's gathers are one-hot sums over [R, R] (no loop over the rows,
  which on a GPU costs a launch per row, and no gather, which the Triton lowering lacks). Row
  31 has the sign bit for itself; rows from 32 on (padding) have no bit of their own."""
  R = parents.shape[-1]
  i32 = jnp.int32
  rows = lax.broadcasted_iota(i32, parents.shape, parents.ndim - 1)
  cols = lax.broadcasted_iota(i32, parents.shape + (R,), parents.ndim)
  up = jnp.where(parents < 0, rows, parents)              # the root points at itself
  bits = jnp.where(rows < 32, jnp.left_shift(i32(1), jnp.minimum(rows, 31)), 0)
  for _ in range(max(R - 1, 0).bit_length()):
    hot = up[..., None] == cols                           # [..., R, R]: each row's pointer
    bits = bits | jnp.sum(jnp.where(hot, bits[..., None, :], 0), axis=-1, dtype=i32)
    up = jnp.sum(jnp.where(hot, up[..., None, :], 0), axis=-1, dtype=i32)
  return bits


def child_first(parents, R):
  """The order [KT] int32 (KT = parents' length, rows past R: 0) in which to run rows 0 ..
  R-1 of one tree, `parents` [KT] int32 (-1: the root; rows past R ignored): the lowest child
  of the row just run where it has one not yet run, else the lowest row not yet run. Every
  row comes after its parent, and a row comes right after its parent whenever that parent
  is the row before it. In jax.numpy that the kernels lower too (two reductions a row)."""
  KT = parents.shape[-1]
  i32 = jnp.int32
  rows = lax.broadcasted_iota(i32, (KT,), 0)
  todo, cur, order = rows < R, jnp.int32(-1), jnp.zeros((KT,), i32)
  for k in range(R):
    kids = todo & (parents == cur)
    pick = jnp.where(jnp.max(jnp.where(kids, 1, 0)) > 0, kids, todo)
    cur = jnp.min(jnp.where(pick, rows, KT))
    order = jnp.where(rows == k, cur, order)
    todo = todo & (rows != cur)
  return order


def parents_from_links(next_token, next_sibling):
  """`parents` [B, R] int32 from a tree given as first-child and next-sibling links, SGLang's
  EAGLE layout (`retrive_next_token`, `retrive_next_sibling` [B, R]: row 0 the root, the
  last accepted token; -1 for none). Every row but the root must be the target of exactly one
  link and the root of none; a sequence whose links break that, or reach a row before its
  parent, gets parents that a call rejects (`valid_parents`). No loop over the rows: the
  sibling chains are followed back to their first child by pointer doubling."""
  child = jnp.asarray(next_token, jnp.int32)
  sib = jnp.asarray(next_sibling, jnp.int32)
  B, R = child.shape
  b = jnp.arange(B)[:, None]
  rows = jnp.broadcast_to(jnp.arange(R, dtype=jnp.int32), (B, R))
  drop = lambda a: jnp.where(a >= 0, a, R)               # -1: written nowhere
  # The row each first child hangs from; the sibling before each row (itself at a chain's head).
  owner = jnp.full((B, R), -1, jnp.int32).at[b, drop(child)].set(rows, mode="drop")
  prev = rows.at[b, drop(sib)].set(rows, mode="drop")
  for _ in range(max(R - 1, 0).bit_length()):
    prev = jnp.take_along_axis(prev, prev, axis=1)
  parents = jnp.take_along_axis(owner, prev, axis=1).at[:, 0].set(-1)
  links = jnp.zeros((B, R + 1), jnp.int32).at[b, drop(child)].add(1).at[b, drop(sib)].add(1)
  ok = jnp.all(links[:, :R] == jnp.minimum(rows, 1), axis=1)     # 0 for the root, else 1
  return jnp.where(ok[:, None], parents, -1)


def parents_from_mask(mask):
  """`parents` [B, R] int32 from an ancestor mask [B, R, R] bool (EAGLE's and SGLang's tree
  mask: [b, i, j] where row j is row i or one of its ancestors, ancestors before their
  descendants): each row's parent is its latest ancestor other than itself. A sequence whose
  mask is not the ancestor mask of those parents (rows out of order, or not a tree) gets
  parents that a call rejects (`valid_parents`)."""
  mask = jnp.asarray(mask, bool)
  R = mask.shape[-1]
  j = jnp.arange(R)
  earlier = mask & (j[None, :] < j[:, None])[None]
  parents = jnp.max(jnp.where(earlier, j, -1), axis=-1).astype(jnp.int32)
  bits = jnp.sum(jnp.where(mask, jnp.left_shift(1, j), 0), axis=-1).astype(jnp.int32)
  ok = jnp.all(bits == ancestor_bits(parents), axis=1)
  return jnp.where(ok[:, None], parents, -1)


def parents_from_paths(paths):
  """Host `parents` [R] int32 (R = len(paths) + 1) of a static tree given as paths of top-k
  choices from the root (Medusa's and vLLM's `speculative_token_tree`, e.g. `[(0,), (1,),
  (0, 0)]`), its rows in the order those lay a tree's draft tokens out: row 0 the root, then
  the paths sorted by length, then by their choices; a node's parent is the node of its path
  less the last choice. Returns (parents, the paths in row order after the root). Raises
  ValueError for a path whose parent is not listed, or a path listed twice."""
  ordered = sorted((tuple(int(c) for c in p) for p in paths), key=lambda p: (len(p), p))
  index = {(): 0}
  parents = [-1]
  for k, path in enumerate(ordered):
    if not path or path in index:
      raise ValueError(f"paths: expected new non-empty paths, got {path} twice or empty")
    if path[:-1] not in index:
      raise ValueError(f"paths: {path}'s parent {path[:-1]} is not listed")
    index[path] = k + 1
    parents.append(index[path[:-1]])
  if len(parents) > MAX_ROWS:
    raise ValueError(f"paths: a tree call takes at most {MAX_ROWS} rows, got {len(parents)}")
  return np.asarray(parents, np.int32), ordered


def parent_ok(parents, xp=jnp):
  """[B, R] `parents` -> [B, R] bool: -1 at row 0 (the root), 0 <= parents[b, r] < r after it.
  The one rule: `checks.parents` applies it to host values (xp=numpy), the verify kernels'
  conv launch to device values (`kernels.verify_conv.tree_parents`), and `valid_parents` for
  the reference backend."""
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

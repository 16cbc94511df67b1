"""A call's arrays (`CallArgs`) and the one validity rule for `state_row`, `cache_indices` and
`num_rows` (docs/semantics.md).

Kernels, reference, host checks and `verify_checked` all use the rule; `xp` is `jax.numpy` or
`numpy`, and the functions take scalars (in a kernel) or [B] arrays.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class CallArgs(NamedTuple):
  """One call's per-sequence arrays, B sequences of R new rows (built by `call_args`).

  Attributes:
    xbc: [B, R, C] raw `[x | B | C]` rows; None in a fold (R = 0).
    dt: [B, R, H] raw dt; None in a fold.
    state_row: [B] int32, the last accepted row of the previous call.
    z: [B, R, H*P] gate, or None.
    cache_indices: [B] int32 pool entries (-1: padding).
    num_rows: [B] int32 rows each sequence runs (0 in a fold).
  """

  xbc: jax.Array | None
  dt: jax.Array | None
  state_row: jax.Array
  z: jax.Array | None
  cache_indices: jax.Array
  num_rows: jax.Array


def call_args(xbc, dt, state_row, z=None, cache_indices=None, num_rows=None, *,
              R: int | None = None) -> CallArgs:
  """`CallArgs` with the defaults: cache_indices arange(B), num_rows R (xbc's rows, or 0
  without xbc: a fold); the index arrays as int32 device arrays. B is state_row's length."""
  if R is None:
    R = 0 if xbc is None else xbc.shape[1]
  state_row, ci, nr = _indices(state_row, cache_indices, num_rows, R=R)
  return CallArgs(xbc, dt, state_row, z, ci, nr)


# Jitted: called eagerly (the public ops), one dispatch rather than one per array.
@functools.partial(jax.jit, static_argnames=("R",))
def _indices(state_row, cache_indices, num_rows, *, R: int):
  """state_row, cache_indices (default arange(B)) and num_rows (default R), int32 [B]."""
  state_row = jnp.asarray(state_row, jnp.int32)
  B = state_row.shape[0]
  ci = (jnp.arange(B, dtype=jnp.int32) if cache_indices is None
        else jnp.asarray(cache_indices, jnp.int32))
  nr = jnp.full((B,), R, jnp.int32) if num_rows is None else jnp.asarray(num_rows, jnp.int32)
  return state_row, ci, nr


def in_pool(entry, E: int):
  """Whether pool index `entry` is one of the E entries (-1, padding, is not)."""
  return (entry >= 0) & (entry < E)


def rows_ok(n, R: int):
  """Whether `num_rows` n fits a call of R rows: [1, R], or 0 for a fold (R = 0)."""
  return (n >= 1) & (n <= R) if R else (n == 0)


def row_ok(compact: bool, cap: int, row, pending, xp=jnp, first=0):
  """Valid `state_row`: snapshot [0, cap); compact [0, pending - first), or 0 with none pending."""
  if compact:
    return xp.where(pending > 0, (row >= 0) & (row < pending - first), row == 0)
  return (row >= 0) & (row < cap)


def last_call_start(starts, xp=jnp):
  """Compact: the window row where the last call's rows start (highest set bit of `starts`)."""
  j = xp.arange(32, dtype=xp.int32)
  bits = (starts[..., None] >> j) & 1
  return xp.max(xp.where(bits > 0, j, 0), axis=-1)


def sequence_status(compact: bool, cap: int, E: int, R: int, entry, row, n, pending, xp=jnp,
                    starts=None, W=None):
  """Per-sequence validity (scalars or arrays).

  Args:
    compact, cap, E: mode, S or W, pool entries.
    R: rows in the call (0 for a fold).
    entry, row, n: pool index (-1 = padding), `state_row`, `num_rows`.
    pending, starts: the entry's pending count and bitmask (compact; starts None: 0).
    xp: array module.
    W: window rows (compact; default cap).

  Returns:
    (valid, pad, n_replay): runs, padding, window rows to fold first (in [0, W]).
  """
  first = 0 if starts is None or not compact else last_call_start(starts, xp)
  row_valid = row_ok(compact, cap, row, pending, xp, first)
  n_replay = (rows_to_replay(cap if W is None else W, row, pending, xp, first) if compact
              else xp.zeros_like(row))
  return in_pool(entry, E) & row_valid & rows_ok(n, R), entry == -1, n_replay


def rows_to_replay(W: int, row, pending, xp=jnp, first=0):
  """Compact: the span of the rows a call folds, `first + row + 1` (0 with none pending),
  clipped to [0, W]: all of them for a chain; a draft tree's fold skips the rows off the
  accepted row's path (`fold_path`), and the call's new rows go past the span."""
  return xp.clip(xp.where(pending > 0, first + row + 1, 0), 0, W)


def walks_paths(cfg) -> bool:
  """Compact: whether the pool's pending rows fit one int32 mask, so that a fold walks the
  accepted row's path (`fold_path`) and draft trees can run; else a fold takes rows 0 ..
  `state_row` of the last call (a chain)."""
  return cfg.window_rows <= 32


def chain_bits(rows):
  """`last_bits` of chain rows `rows`: row t's bits 0 .. t (int32; row 31: all 32)."""
  return (jnp.left_shift(jnp.int32(1), rows + 1) - 1).astype(jnp.int32)


def fold_path(pending, first, row_bits):
  """Compact: the pending rows a call folds, as a mask over pending rows (bit j: row j): the
  earlier calls' accepted rows 0 .. first-1 and the last call's accepted row with its
  ancestors (`row_bits`, its `last_bits`, shifted by `first`); 0 with nothing pending. A
  chain's is rows 0 .. first + state_row, `rows_to_replay` of them."""
  head = jnp.left_shift(jnp.int32(1), first) - 1
  return jnp.where(pending > 0, head | jnp.left_shift(row_bits, first), 0).astype(jnp.int32)


def path_taps(row_bits, K1):
  """Compact: the conv window after the last call's row whose `last_bits` are `row_bits` (0:
  nothing pending): the last K1 entries of [conv state; the row's path]. Returns, for each
  entry j, (conv state column, last call's row): the row where it is >= 0, else the column.
  Scalars in a kernel, [B] arrays in the reference."""
  d = jax.lax.population_count(row_bits)
  rest, tops = row_bits, []                 # the path's rows from the last one back
  for _ in range(K1):
    top = 31 - jax.lax.clz(rest)            # -1 once none is left
    tops.append(top)
    rest = jnp.where(top >= 0, rest & ~jnp.left_shift(1, jnp.maximum(top, 0)), 0)
  return [(d + j, tops[K1 - 1 - j]) for j in range(K1)]


def flushes(cfg, R: int, n_replay, n, xp=jnp, path=None):
  """Compact: whether a call flushes (new base, its rows from window row 0). With `path`
  (`fold_path`), also where the folded rows leave a gap (a draft tree's rows off the accepted
  path), since the rows kept pending must be the accepted ones, back to back."""
  if not cfg.deferred or R == 0 or R > cfg.capacity:
    return xp.ones(xp.shape(n_replay), bool)
  flush = n_replay + n > cfg.window_rows
  if path is not None:
    flush = flush | (jax.lax.population_count(path) != n_replay)
  return flush


def window_after(cfg, R: int, n_replay, n, starts, flush, xp=jnp):
  """Compact: (window row of the first kept row, pending rows after the call, new `starts`)."""
  n_keep = n - max(R - cfg.capacity, 0) if R else xp.zeros_like(n)
  woff = xp.where(flush, 0, n_replay)
  # At woff = 31, bit - 1 wraps from INT32_MIN to 0x7fffffff (rows 0..30), as XLA, NumPy, Triton do.
  bit = xp.left_shift(1, woff).astype(xp.int32)
  new_starts = xp.where(n_keep > 0, (starts & (bit - 1)) | bit, 0).astype(xp.int32)
  return woff, woff + n_keep, new_starts


def ring_row(cfg, origin, j):
  """Compact: the ring row of pending row j."""
  return (origin + j) % cfg.ring_rows


def ring_origin(cfg, origin, n_replay, flush, xp=jnp):
  """Compact: the ring row of pending row 0 after a call (past the folded rows on a flush)."""
  return xp.where(flush, ring_row(cfg, origin, n_replay), origin).astype(xp.int32)


def safe_entry(entry, E: int):
  """`entry` if in [0, E), else 0 (then only masked work uses it)."""
  return jnp.where(in_pool(entry, E), entry, 0)


def entry_status(cfg, state, R: int, args: CallArgs):
  """(safe entry, valid, padding), each [B], of a call of R rows, on the device."""
  ci = args.cache_indices
  E = state.ssm.shape[0]
  safe = safe_entry(ci, E)
  pending = state.pending[safe] if cfg.compact else jnp.zeros_like(ci)
  starts = state.starts[safe] if cfg.compact else None
  valid, pad, _ = sequence_status(cfg.compact, cfg.capacity, E, R, ci, args.state_row,
                                  args.num_rows, pending, starts=starts, W=cfg.window_rows)
  return safe, valid, pad


def shared_entries(cache_indices, xp=jnp):
  """[B] bool: a live entry that another sequence of the call also addresses (writes would race)."""
  ci = cache_indices
  B = ci.shape[0]
  other = xp.arange(B)[None, :] != xp.arange(B)[:, None]
  return (ci >= 0) & xp.any((ci[:, None] == ci[None, :]) & other, axis=1)


def reject_shared(cache_indices, E: int):
  """cache_indices with shared entries replaced by E (out of the pool), so they are rejected."""
  return jnp.where(shared_entries(cache_indices), E, cache_indices).astype(jnp.int32)

"""Which sequences a call runs: the one validity rule for `state_row`, `cache_indices` and
`num_rows`.

The kernels (on the device), the jax.numpy reference, the host-side argument checks
(`checks`) and the checked op (`ops.verify_checked`) all call these functions, so a
sequence is accepted or rejected by the same rule everywhere. The functions take an array
module (`xp`: `jax.numpy`, or `numpy` on the host) and work on scalars inside a kernel as
well as on [B] arrays.

The rule, for a sequence whose pool entry is `entry` in a call of R rows:
- `entry` is -1 (padding: nothing is read or written, y = 0) or in [0, E);
- snapshot: 0 <= state_row < S; compact: 0 <= state_row < (the last call's pending rows)
  when rows are pending, else state_row == 0;
- 1 <= num_rows <= R (a fold, R = 0, runs no new rows: num_rows == 0).
A sequence that breaks it is rejected: its entry is left exactly as it was and its y is NaN.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def row_ok(compact: bool, cap: int, row, pending, xp=jnp, first=0):
  """Whether `state_row` is valid: snapshot `0 <= row < cap` (S); compact
  `0 <= row < pending - first` (the last call's rows, which start at window row `first`)
  when rows are pending, else `row == 0`."""
  if compact:
    return xp.where(pending > 0, (row >= 0) & (row < pending - first), row == 0)
  return (row >= 0) & (row < cap)


def last_call_start(starts, xp=jnp):
  """Compact: the window row where the last call's rows start, the highest set bit of the
  `starts` bitmask (0 when none is set)."""
  j = xp.arange(32, dtype=xp.int32)
  bits = (starts[..., None] >> j) & 1
  return xp.max(xp.where(bits > 0, j, 0), axis=-1)


def sequence_status(compact: bool, cap: int, E: int, R: int, entry, row, n, pending, xp=jnp,
                    starts=None, W=None):
  """Per-sequence validity (scalars or arrays).

  Args:
    compact: mode.
    cap: S or W.
    E: pool entries.
    R: rows in the call (0 for a fold).
    entry: pool index (-1 = padding).
    row: `state_row`.
    n: `num_rows` (R when not given).
    pending: the entry's pending-row count (compact; ignored in snapshot mode).
    xp: array module.
    starts: the entry's `starts` bitmask (compact; None: the last call starts at row 0).
    W: window rows (compact; default cap).

  Returns:
    (valid, pad, n_replay): valid = the call runs for this sequence; pad = padding entry;
    n_replay = window rows to fold first (compact), clipped to [0, W].
  """
  in_pool = (entry >= 0) & (entry < E)
  first = 0 if starts is None or not compact else last_call_start(starts, xp)
  row_valid = row_ok(compact, cap, row, pending, xp, first)
  n_replay = (rows_to_replay(cap if W is None else W, row, pending, xp, first) if compact
              else xp.zeros_like(row))
  n_ok = (n >= 1) & (n <= R) if R else (n == 0)
  return in_pool & row_valid & n_ok, entry == -1, n_replay


def rows_to_replay(W: int, row, pending, xp=jnp, first=0):
  """Compact: window rows a call folds, `first + row + 1` (the earlier calls' accepted rows
  and rows 0..row of the last call; 0 with nothing pending), clipped to [0, W]."""
  return xp.clip(xp.where(pending > 0, first + row + 1, 0), 0, W)


def flushes(cfg, R: int, n_replay, n, xp=jnp):
  """Compact: whether a call of R rows (R = 0: a fold) writes the start state as the new base
  and its rows from window row 0. Always without deferred commit, for a fold and for R >
  capacity; with deferred commit, when the folded rows and the call's `n` rows would not fit
  in the window. (Nothing is written when nothing is folded.)"""
  if not cfg.deferred or R == 0 or R > cfg.capacity:
    return xp.ones(xp.shape(n_replay), bool)
  return n_replay + n > cfg.window_rows


def window_after(cfg, R: int, n_replay, n, starts, flush, xp=jnp):
  """Compact: (window row of the call's first kept row, pending rows after the call, its
  `starts` bitmask) for a call of R rows of which `n` run, by `flushes`."""
  n_keep = n - max(R - cfg.capacity, 0) if R else xp.zeros_like(n)
  woff = xp.where(flush, 0, n_replay)
  # woff <= 31. At 31, bit is INT32_MIN and bit - 1 wraps to 0x7fffffff, the mask of rows
  # 0..30: XLA, NumPy arrays and Triton's `arith.subi` (no overflow flags) all wrap.
  bit = xp.left_shift(1, woff).astype(xp.int32)
  new_starts = xp.where(n_keep > 0, (starts & (bit - 1)) | bit, 0).astype(xp.int32)
  return woff, woff + n_keep, new_starts


def ring_row(cfg, origin, j):
  """Compact: the ring row of pending row j (ring origin `origin`). A call's kept row i goes to
  `ring_row(cfg, origin, n_replay + i)` (origin before the call), past the rows it folds."""
  return (origin + j) % cfg.ring_rows


def ring_origin(cfg, origin, n_replay, flush, xp=jnp):
  """Compact: the ring row of pending row 0 after a call: past the folded rows when the call
  flushes, else where it was (the call's kept rows stay where `ring_row` put them)."""
  return xp.where(flush, ring_row(cfg, origin, n_replay), origin).astype(xp.int32)


def safe_entry(entry, E: int):
  """The pool entry to address: `entry` when it is in [0, E), else 0 (then only masked
  work uses it)."""
  return jnp.where((entry >= 0) & (entry < E), entry, 0)


def index_defaults(B, R, cache_indices, num_rows):
  """cache_indices (default arange(B)) and num_rows (default R) as int32 [B] arrays."""
  ci = (jnp.arange(B, dtype=jnp.int32) if cache_indices is None
        else jnp.asarray(cache_indices, jnp.int32))
  nr = jnp.full((B,), R, jnp.int32) if num_rows is None else jnp.asarray(num_rows, jnp.int32)
  return ci, nr


def entry_status(cfg, state, state_row, R: int, cache_indices, num_rows=None):
  """(safe entry [B], valid [B], padding [B]) of a call of R rows, on the device, by
  `sequence_status`."""
  B = state_row.shape[0]
  ci, nr = index_defaults(B, R, cache_indices, num_rows)
  E = state.ssm.shape[0]
  safe = safe_entry(ci, E)
  pending = state.pending[safe] if cfg.compact else jnp.zeros_like(ci)
  starts = state.starts[safe] if cfg.compact else None
  valid, pad, _ = sequence_status(cfg.compact, cfg.capacity, E, R, ci,
                                  jnp.asarray(state_row, jnp.int32), nr, pending,
                                  starts=starts, W=cfg.window_rows)
  return safe, valid, pad


def shared_entries(cache_indices, xp=jnp):
  """[B] bool: a live entry (>= 0) that another sequence of the same call also addresses
  (every such sequence is marked). Two sequences must not share an entry: their writes
  would race."""
  ci = cache_indices
  B = ci.shape[0]
  other = xp.arange(B)[None, :] != xp.arange(B)[:, None]
  return (ci >= 0) & xp.any((ci[:, None] == ci[None, :]) & other, axis=1)


def reject_shared(cache_indices, E: int):
  """cache_indices with every shared entry (`shared_entries`) replaced by E, out of the
  pool: the kernels then reject those sequences (y NaN, no entry written)."""
  return jnp.where(shared_entries(cache_indices), E, cache_indices).astype(jnp.int32)

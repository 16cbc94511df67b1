"""The public ops: check the arguments (`checks`), then dispatch (`dispatch`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from m2v_jax import checks
from m2v_jax import config as config_lib
from m2v_jax import dispatch
from m2v_jax import params as params_lib
from m2v_jax import state as state_lib
from m2v_jax import status
from m2v_jax.kernels import tiles as tiles_lib

Mamba2Config = config_lib.Mamba2Config


def verify(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt, state_row, *,
           z=None, cache_indices=None, num_rows=None, parents=None, backend: str | None = None):
  """Runs R <= capacity rows (the last token and R-1 drafts) through the conv and the SSM.

  Snapshot mode starts from slot `state_row[b]` and writes the state after row r to slot r;
  compact mode folds pending rows 0..state_row[b] (a draft tree's: that row's path) into the
  base and keeps the R rows pending.
  Both modes give bitwise the same y and states on one backend with S == W (one exception,
  docs/semantics.md: compiled, 16-bit state with float32 activations). Math: Mamba-2 (Dao &
  Gu, "Transformers are SSMs", 2024); y in the SSD dual form, equal to one-row calls' to
  float32 rounding (with a float32 state).

  Args:
    cfg: geometry and mode; params: `LayerParams` (float32).
    state: `SnapshotState` or `CompactState` pool of E entries; donated when called eagerly.
    xbc: [B, R, C] raw `[x | B | C]`; dt: [B, R, H] raw dt; float32, bfloat16 or float16.
    state_row: [B] int32, the last accepted row of the previous call.
    z: optional [B, R, H*P] gate in xbc's dtype (y *= silu(z)).
    cache_indices: optional [B] int32 entries (-1: padding, y = 0); default arange(B). An
      entry shared by two sequences of a device array rejects both.
    num_rows: optional [B] int32 in [1, R]; later rows change nothing and give y = 0.
    parents: optional [B, R] int32, a draft tree: each row's parent row, -1 for row 0 (the
      root) and 0 <= parents[b, r] < r after it; each row then runs from its parent's state
      and conv window, and y sums over its ancestors (docs/semantics.md, "Draft trees"); at
      most 31 rows. Either mode (compact: the next call folds the accepted row's path);
      device values that break the rule reject their sequence. `m2v_jax.tree` converts
      SGLang's, EAGLE's and vLLM's tree layouts to it.
    backend: "pallas", "interpret", "reference", or None (`resolve_backend`).

  Returns:
    (y [B, R, H*P] in xbc's dtype, new state); a sequence rejected on the device gets NaN y
    and an untouched entry.

  Raises:
    ValueError / TypeError: bad shapes or dtypes, R > capacity, host indices out of range or
      shared, host `parents` that break the rule.
    NotImplementedError: `parents` in compact mode with a window of more than 32 rows.
  """
  backend = config_lib.resolve_backend(backend)
  state_row, cache_indices, num_rows = checks.call(
      cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, verify=True)
  checks.backend(cfg, backend)
  if parents is not None:      # dispatch.call rejects the pools trees lack as it traces
    parents = checks.parents(parents, xbc.shape[0], xbc.shape[1])
  return _verify(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, backend,
                 parents)


def _verify(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, backend,
            parents=None):
  """`verify` on arguments that `checks.call` and `checks.backend` passed (`dispatch.call`
  applies their defaults inside its jit)."""
  args = status.CallArgs(xbc, dt, state_row, z, cache_indices, num_rows)
  return dispatch.call(params, state, args, cfg=cfg, backend=backend, chunked=False,
                       ragged=False, entries_checked=checks.entries_checked(cache_indices),
                       parents=parents)


def prefill(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt, state_row, *,
            z=None, cache_indices=None, num_rows=None, backend: str | None = None,
            chunked: bool | None = None, chunk_tiles: tiles_lib.ChunkTiles | None = None):
  """Runs a chunk of any length R >= 1 and hands off to the next call like a verify call.

  Snapshot slot s then holds the state after row R - S + s (R > S) or s; compact mode folds at
  `state_row`, commits rows 0..R-capacity-1 and keeps the last rows pending. Those body rows
  run through the chunked SSD scan when `chunked` (default `dispatch.use_chunked`: at Bolt
  bodies of 40 rows or more with bf16 products, 64 in a call of two or more sequences, 168
  at "highest" with bfloat16 activations, 2048 in a call of two or three sequences, 8192 from
  four; 40 with float32 activations and other products; 400 in other 16-bit cases of
  "highest" or tf32 products; other geometries in docs/design.md), products at `cfg.prefill_precision`,
  else through the verify kernels in segments of `TileConfig.body_rows` rows, each folded in
  one float32-accurate product; the last capacity rows through the verify kernels. With `num_rows`
  each sequence hands off as a prefill of its own n rows (ragged).

  Args, returns: as `verify`, plus `chunked` (ignored by the reference backend) and
  `chunk_tiles` (overrides `chunk_tile_config(cfg, precision, xbc.dtype)`, the default). The
  chunked path's scratch grows with B x R up to `ChunkTiles.scratch_mb` (100 MB by default)
  per sequence, past which the body runs in segments (docs/design.md, "Segments"); prompts
  of different lengths are better given to `prefill_packed`.

  Raises:
    ValueError / TypeError: as `verify` (any R); `chunked=True` or a ragged R > capacity on a
      geometry the pallas chunked scan does not take (`chunk_scan.supported`); a ragged
      prefill with `chunked=False`, or with device `num_rows` on the reference backend;
      `chunk_tiles` whose chunk is below K-1 (or 16, compiled), or whose `scratch_mb` no
      count of segments meets (at least a chunk per sequence; the error names the least).
  """
  backend = config_lib.resolve_backend(backend)
  state_row, cache_indices, num_rows = checks.call(
      cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, verify=False)
  checks.backend(cfg, backend)
  R = xbc.shape[1]
  # Ragged: each sequence hands off at its own num_rows past a body (R > capacity).
  ragged = num_rows is not None and R > cfg.capacity
  entries_checked = checks.entries_checked(cache_indices)
  if ragged and backend == config_lib.REFERENCE:
    args = status.call_args(xbc, dt, state_row, z, cache_indices, num_rows)
    return dispatch.ragged_reference(cfg, params, state, args, num_rows, entries_checked)
  chunked = dispatch.use_chunked(cfg, backend, R, chunked, xbc.dtype, ragged,
                                 batch=xbc.shape[0])
  args = status.CallArgs(xbc, dt, state_row, z, cache_indices, num_rows)  # defaults: in call
  return dispatch.call(params, state, args, cfg=cfg, backend=backend, chunked=chunked,
                       ragged=ragged, chunk_tiles=chunk_tiles if chunked else None,
                       entries_checked=entries_checked)


def prefill_packed(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt,
                   cu_seqlens, *, state_row=0, z=None, cache_indices=None,
                   backend: str | None = None,
                   chunk_tiles: tiles_lib.ChunkTiles | None = None):
  """Prefills S prompts given back to back (vLLM's and mamba_ssm's `cu_seqlens` layout).

  Prompt s (rows cu_seqlens[s] .. cu_seqlens[s+1] - 1) starts from its entry's committed state
  at `state_row` and leaves the entry as `prefill` of it alone would, in either mode: the next
  verify continues it from state_row = min(n_s, capacity) - 1. Bodies
  run through the chunked scan in chunks that never straddle two prompts, each prompt's last
  min(n, capacity) rows through one verify call; no kernel runs past cu_seqlens[S]. Shapes are
  static in T and S only.

  Args:
    cfg, params, state, z, cache_indices, backend: as `verify`, with S sequences and T rows
      (z [T, H*P]); "reference" needs host `cu_seqlens`.
    xbc: [T, C] raw rows of all prompts; dt: [T, H]; float32, bfloat16 or float16.
    cu_seqlens: [S+1] int32 offsets: 0 first, increasing (every prompt has a row), at most T.
    state_row: [S] int32 (or one int for all), as in `prefill`.
    chunk_tiles: overrides `chunk_tile_config(cfg, precision, xbc.dtype)` (its `scratch_mb`
      bounds the scratch to that many MB per prompt).

  Returns:
    (y [T, H*P] in xbc's dtype, 0 past cu_seqlens[S]; new state). A prompt rejected on the
    device (state_row, entry, or offsets out of order, empty, past T, or not starting at 0)
    gets NaN rows (from row 0 for the last case) and an untouched entry.

  Raises:
    ValueError / TypeError: as `verify`; host offsets not starting at 0, an empty prompt,
      offsets past T; a geometry the compiled chunked scan does not take; `chunk_tiles`
      whose `scratch_mb` no count of segments meets (the error names the least).
  """
  backend = config_lib.resolve_backend(backend)
  cu, state_row, cache_indices = checks.packed(cfg, params, state, xbc, dt, cu_seqlens,
                                               state_row, z, cache_indices)
  checks.backend(cfg, backend)
  entries_checked = checks.entries_checked(cache_indices)
  args = status.CallArgs(xbc, dt, state_row, z, cache_indices, None)   # defaults: in dispatch
  if backend == config_lib.REFERENCE:
    return dispatch.packed_reference(cfg, params, state, args, cu, entries_checked)
  dispatch.check_packed(cfg, backend)
  return dispatch.packed(params, state, args, jnp.asarray(cu, jnp.int32), cfg=cfg,
                         backend=backend, chunk_tiles=chunk_tiles,
                         entries_checked=entries_checked)


def committed_state(cfg: Mamba2Config, params: params_lib.LayerParams, state, state_row, *,
                    cache_indices=None, backend: str | None = None):
  """The committed state at `state_row` of each sequence, in either mode (prefix-cache capture).

  Compact: the base with rows 0..state_row[b] (a draft tree's: that row's path) folded in,
  bitwise the next call's start state.
  The pool is neither modified nor donated. Args as `verify`; `state_row` is 0 in compact mode
  with nothing pending.

  Returns:
    (ssm [B, H, P, N] float32, conv [B, C, K-1] in the pool's conv dtype); zeros for padding,
    NaN for an invalid device-side `state_row` or entry.

  Raises:
    ValueError / TypeError: wrong shapes or dtypes, host `state_row` out of range.
  """
  backend = config_lib.resolve_backend(backend)
  checks.config(cfg)
  checks.params(cfg, params)
  checks.backend(cfg, backend)
  checks.state(cfg, state, state_lib.activation_dtype(state))
  E = state.ssm.shape[0]
  B = np.shape(state_row)[0] if np.ndim(state_row) else E
  cache_indices = checks.entries(cache_indices, B, E)
  state_row = checks.state_rows(cfg, state_row, B, cache_indices)
  return dispatch.committed(params, state,
                            status.CallArgs(None, None, state_row, None, cache_indices, None),
                            cfg=cfg, backend=backend)


def convert_state(cfg: Mamba2Config, params: params_lib.LayerParams, state, state_row,
                  to_cfg: Mamba2Config, *, dtype=None, state_dtype=None,
                  backend: str | None = None):
  """Converts a pool to `to_cfg` (same geometry, any mode) through its committed states (E == B).

  `dtype` (activation) and `state_dtype` default to the pool's; the next `state_row` is 0.
  Returns the new pool. Raises ValueError for another geometry, and as `committed_state`.
  """
  ignore = dict(replay_mode=None, capacity=None, window=None)
  if dict(vars(cfg), **ignore) != dict(vars(to_cfg), **ignore):
    raise ValueError(f"to_cfg: expected the geometry of cfg, got {to_cfg} for {cfg}")
  ssm, conv = committed_state(cfg, params, state, state_row, backend=backend)
  return state_lib.state_from_committed(to_cfg, ssm, conv,
                                        dtype or state_lib.activation_dtype(state),
                                        state_dtype or state.ssm.dtype)


def invalid_sequences(cfg: Mamba2Config, state, state_row, R: int, *, cache_indices=None,
                      num_rows=None):
  """[B] bool on the device: the sequences a call of R rows would reject (padding excluded),
  shared entries included. A host scalar `state_row` or `num_rows` applies to every sequence;
  B is the length of `cache_indices`, else of `state_row`, else the pool's E."""
  if cache_indices is not None:
    B = np.shape(cache_indices)[0]
  else:
    B = np.shape(state_row)[0] if np.ndim(state_row) else state.ssm.shape[0]
  per_sequence = lambda name, v: (checks.host_int_array(name, v, B)
                                  if v is not None and checks.is_host(v) else v)
  args = status.call_args(None, None, per_sequence("state_row", state_row),
                          cache_indices=cache_indices,
                          num_rows=per_sequence("num_rows", num_rows), R=R)
  _, valid, pad = status.entry_status(cfg, state, R, args)
  return ~valid & ~pad | status.shared_entries(args.cache_indices)


def verify_checked(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt,
                   state_row, *, z=None, cache_indices=None, num_rows=None,
                   backend: str | None = None):
  """`verify` plus a `checkify.Error` naming the first rejected sequence and its cause (an entry
  outside the pool, num_rows outside [1, R], or state_row), or an entry that two sequences share.

  Returns (y, new_state, err); `err.throw()` raises, `err.get()` gives the message or None
  (a device-to-host read). Raises as `verify`.
  """
  backend = config_lib.resolve_backend(backend)
  rows, entries, nr = checks.call(cfg, params, state, xbc, dt, state_row, z, cache_indices,
                                  num_rows, verify=True)
  checks.backend(cfg, backend)
  R = xbc.shape[1]
  args = status.call_args(None, None, rows, cache_indices=entries, num_rows=nr, R=R)
  _, valid, pad = status.entry_status(cfg, state, R, args)
  ci, n, E = args.cache_indices, args.num_rows, state.ssm.shape[0]
  repeated = status.shared_entries(ci)
  bad = ~valid & ~pad & ~repeated           # shared entries: reported by the last check
  first = jnp.argmax(bad).astype(jnp.int32)
  row, entry, rows_n = args.state_row[first], ci[first], n[first]
  if cfg.compact:
    safe = jnp.clip(entry, 0, E - 1)
    pend = state.pending[safe] - status.last_call_start(state.starts[safe])
  else:
    pend = jnp.int32(cfg.capacity)
  # The first failing cause of the first rejected sequence: entry, num_rows, state_row.
  cause = jnp.where(~status.in_pool(entry, E), 0,
                    jnp.where(~status.rows_ok(rows_n, R), 1, jnp.where(pend > 0, 2, 3)))
  cause = jnp.where(jnp.any(bad), cause, -1)
  dup = jnp.argmax(repeated).astype(jnp.int32)

  def check(c, s, r, p, e, k, d, de):
    checkify.check(c != 0, f"cache_indices: sequence {{s}} addresses entry {{e}}, outside the "
                   f"pool's {E} entries (rejected)", s=s, e=e)
    checkify.check(c != 1, f"num_rows: sequence {{s}} has num_rows={{k}}, outside [1, R={R}] "
                   "(rejected)", s=s, k=k)
    checkify.check(c != 2, "state_row rejected for sequence {s}: state_row={r}, allowed "
                   "0 <= state_row < {p}", s=s, r=r, p=p)
    checkify.check(c != 3, "state_row rejected for sequence {s}: state_row={r}, but nothing is "
                   "pending for its entry, so state_row must be 0", s=s, r=r)
    checkify.check(d < 0, "cache_indices: sequence {d} addresses pool entry {e}, which "
                   "another sequence of the call addresses too (all of them rejected)", d=d, e=de)

  err, _ = checkify.checkify(check)(cause, first, row, pend, entry, rows_n,
                                    jnp.where(jnp.any(repeated), dup, -1), ci[dup])
  y, new_state = _verify(cfg, params, state, xbc, dt, rows, z, entries, nr, backend)
  return y, new_state, err

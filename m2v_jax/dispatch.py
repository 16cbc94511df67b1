"""From a checked call to the kernels: the backend and path of every op, composed here.

`call` is the one jitted entry of `verify` and `prefill` (the state is donated, so the pool
is updated in place when called eagerly). It runs one of three paths:

- `reference`: the jax.numpy reference (`m2v_jax.reference`);
- verify: `kernel_call`, the two launches of `kernels.verify` (any R);
- chunked (`prefill` only): `chunked_call` splits the call's R rows into a body of
  R - capacity rows and a tail of `capacity` rows, the same split in both modes. Compact mode
  first folds the pending window (`fold`); the body's conv runs in `kernels.chunk_conv` and
  its scan in `kernels.chunk_scan`; the tail runs through `kernel_call`, which leaves its rows
  as the snapshots (snapshot) or the pending window (compact). Both modes start the body
  from bitwise the same state and run the tail through the same kernels, so they stay
  bitwise identical across a prefill. With `num_rows` (a ragged prefill) each sequence of n
  rows has its own body of n - capacity rows and its own tail, gathered.

`committed` is the jitted entry of `committed_state`. Benchmarks, tools and tests use the
functions here (all documented) to run a path or a tile variant directly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from m2v_jax import config as config_lib
from m2v_jax import reference
from m2v_jax import status
from m2v_jax.kernels import chunk_conv
from m2v_jax.kernels import chunk_scan
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels import verify as verify_kernels
from m2v_jax.state import CompactState, SnapshotState

f32 = jnp.float32

# Body rows (R - capacity) from which `prefill` takes the chunked path by default, with
# float32 products (3-pass or 1-pass TF32) and with bf16 products: measured at Bolt geometry,
# B=1 (BENCHMARKS.md, "Prefill").
MIN_CHUNKED_ROWS = 64
MIN_CHUNKED_ROWS_BF16 = 24


def use_chunked(cfg: config_lib.Mamba2Config, backend: str, R: int, chunked: bool | None,
                dtype=jnp.float32):
  """Whether a prefill of R rows of activation dtype `dtype` runs its body through the
  chunked scan.

  `chunked=None` chooses: on the kernel backends, when the body has at least
  `MIN_CHUNKED_ROWS` rows (`MIN_CHUNKED_ROWS_BF16` with bf16 products) and the geometry is
  supported (`chunk_scan.supported`; interpret mode takes any). The reference backend
  always runs the serial recurrence, and a call of R <= capacity rows has no body.
  """
  if chunked is None:
    bf16 = cfg.prefill_precision_for(dtype) == config_lib.BF16
    chunked = (R - cfg.capacity >= (MIN_CHUNKED_ROWS_BF16 if bf16 else MIN_CHUNKED_ROWS)
               and (chunk_scan.supported(cfg) or backend == config_lib.INTERPRET))
  return bool(chunked) and R > cfg.capacity and backend != config_lib.REFERENCE


def plan(cfg, backend, state, R, *, B, y_dtype, has_z=False, tiles=None):
  """The verify kernels' static plan (`kernels.verify.Plan`) of a call of R rows (R = 0: a
  fold) on `state`."""
  return verify_kernels.Plan(
      cfg=cfg, R=R, E=state.ssm.shape[0], B=B, has_z=has_z, y_dtype=jnp.dtype(y_dtype),
      conv_dtype=jnp.dtype(state.conv.dtype), tiles=tiles or tiles_lib.tile_config(cfg),
      interpret=backend == config_lib.INTERPRET, state_dtype=jnp.dtype(state.ssm.dtype))


def kernel_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices, num_rows,
                tiles=None):
  """One call of the verify kernels, any R, either mode; `tiles` overrides the tile table.

  Arguments as `m2v_jax.verify` after checking: cache_indices and num_rows [B] int32 arrays
  (with R > capacity every sequence runs all R rows: `prefill` sends ragged prompts through
  `chunked_call`). Returns (y [B, R, H*P], new state).
  """
  B, R, _ = xbc.shape
  p = plan(cfg, backend, state, R, B=B, y_dtype=xbc.dtype, has_z=z is not None, tiles=tiles)
  return verify_kernels.run(p, params, state, xbc, dt, state_row, z, cache_indices, num_rows)


def fold(cfg, backend, params, state: CompactState, state_row, cache_indices):
  """Compact pre-pass on the kernels: folds window rows 0..state_row into the base.

  Returns the new CompactState (pending counts of valid sequences set to 0).
  """
  B = state_row.shape[0]
  p = plan(cfg, backend, state, 0, B=B, y_dtype=state.win_xb.dtype)
  zeros = jnp.zeros((B,), jnp.int32)
  return verify_kernels.run(p, params, state, None, None, state_row, None, cache_indices,
                            zeros)[1]


def chunk_plan(cfg, backend, state, xbc, z, tiles=None) -> chunk_scan.ChunkPlan:
  """The chunked body's static plan for a prefill of xbc [B, R, C]; `tiles` overrides the
  chunk-tile table."""
  B, R, _ = xbc.shape
  return chunk_scan.ChunkPlan(
      cfg=cfg, Rb=R - cfg.capacity, E=state.ssm.shape[0], B=B, has_z=z is not None,
      y_dtype=jnp.dtype(xbc.dtype),
      tiles=tiles or tiles_lib.chunk_tile_config(cfg, cfg.prefill_precision_for(xbc.dtype)),
      interpret=backend == config_lib.INTERPRET)


def body_inputs(plan_: chunk_scan.ChunkPlan, params, conv0, xbc, dt, rb):
  """Post-conv rows [B, Rp, C] (activation dtype) and processed dt [B, Rp, H] f32 of the
  body (rows 0..rb[b]-1 of xbc [B, R, C] and dt [B, R, H]), zero from each sequence's rb on
  (padded rows: x = B = C = 0, dt = 0: no decay, no input), and the conv state after rb
  rows [B, C, K-1] f32. conv0 [B, C, K-1]: the conv state before the body."""
  cfg, Rb, Rp = plan_.cfg, plan_.Rb, plan_.Rp
  K = cfg.d_conv
  post = chunk_conv.body_conv(plan_, xbc, conv0, rb, params.conv_weight, params.conv_bias)
  dtp = rowmath.process_dt(dt[:, :Rb].astype(f32), params.dt_bias, cfg.dt_limit)
  dtp = jnp.where((jnp.arange(Rb)[None, :] < rb[:, None])[..., None], dtp, 0.0)
  # The last K-1 raw inputs before row rb: rows rb-K+1.. of [conv0 rows; xbc rows].
  src = rb[:, None] - (K - 1) + jnp.arange(K - 1)[None, :]                  # [B, K-1]
  body = jnp.take_along_axis(xbc, jnp.clip(src, 0, xbc.shape[1] - 1)[..., None], axis=1)
  head = jnp.take_along_axis(jnp.swapaxes(conv0, 1, 2),
                             jnp.clip(src + K - 1, 0, K - 2)[..., None], axis=1)
  conv_end = jnp.where((src >= 0)[..., None], body.astype(f32), head.astype(f32))
  return (post, jnp.pad(dtp, [(0, 0), (0, Rp - Rb), (0, 0)]), jnp.swapaxes(conv_end, 1, 2))


def chunked_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices,
                 num_rows=None, tiles=None):
  """A prefill whose body runs through the chunked scan (see the module docstring).

  Arguments as `m2v_jax.prefill` after checking (cache_indices a [B] int32 array; num_rows
  None or [B] int32: a ragged prefill); `tiles` overrides the chunk-tile table. Returns
  (y [B, R, H*P], new state).

  A sequence of n rows (R without num_rows) runs its first n - capacity rows (rb, its body)
  through the chunked scan and its last min(n, capacity) rows through the verify kernels;
  in compact mode the pre-pass folds the pending window of the sequences with a body (a
  sequence of n <= capacity rows runs as a verify call of n rows).
  """
  B, R, _ = xbc.shape
  cap = cfg.capacity
  if R <= cap:
    raise ValueError(f"chunked prefill: needs R > capacity ({cap}), got R={R}")
  E = state.ssm.shape[0]
  ragged = num_rows is not None
  n = num_rows if ragged else jnp.full((B,), R, jnp.int32)
  safe, valid, pad = status.entry_status(cfg, state, state_row, R, cache_indices, n)
  p = chunk_plan(cfg, backend, state, xbc, z, tiles)
  Rb, Rp = p.Rb, p.Rp
  rb = jnp.clip(n - cap, 0, Rb).astype(jnp.int32)                  # body rows of each
  if cfg.compact:
    # Ragged: only the valid sequences with a body are folded first (one rejected for its
    # num_rows must keep its window).
    fold_idx = jnp.where(valid & (n > cap), cache_indices, -1) if ragged else cache_indices
    state = fold(cfg, backend, params, state, state_row, fold_idx)
    conv0 = state.conv[safe]
    tail_row = jnp.where(valid, jnp.where(n > cap, 0, state_row), -1).astype(jnp.int32)
  else:
    slot = jnp.where(valid, state_row, 0)
    conv0 = state.conv[safe, slot]
    tail_row = jnp.where(valid | pad, state_row, -1).astype(jnp.int32)   # -1: rejected
  post, dtp, conv_end = body_inputs(p, params, conv0, xbc, dt, rb)
  # The kernels read z's first Rp rows: the call's own z unless the padding reaches past it.
  zb = None if z is None else (z if Rp <= R else jnp.pad(z, [(0, 0), (0, Rp - R), (0, 0)]))
  fill = jnp.where(pad, 0.0, jnp.nan).astype(f32)            # y rows of a sequence not run
  ssm, y = chunk_scan.chunk_scan(p, cache_indices, state_row, valid.astype(jnp.int32), rb,
                                 fill, post, dtp, zb, params.A_log, params.D, state.ssm)
  target = jnp.where(valid, cache_indices, E)              # invalid: dropped
  if cfg.compact:
    conv = state.conv.at[target].set(conv_end.astype(state.conv.dtype), mode="drop")
    state = state._replace(ssm=ssm, conv=conv)
  else:
    conv = state.conv.at[target, jnp.where(valid, state_row, 0)].set(
        conv_end.astype(state.conv.dtype), mode="drop")
    state = SnapshotState(ssm=ssm, conv=conv)
  if not ragged:
    tail = slice(Rb, R)
    y_tail, state = kernel_call(cfg, backend, params, state, xbc[:, tail], dt[:, tail],
                                tail_row, None if z is None else z[:, tail], cache_indices,
                                jnp.full((B,), cap, jnp.int32))
    # The tail's y goes over rows Rb..R-1 of the body's y buffer (in place).
    y = lax.dynamic_update_slice(y, y_tail, (0, Rb, 0))
    return (y if p.y_rows == R else y[:, :R]), state
  # Ragged: each sequence's tail is its rows rb .. rb + min(n, cap) - 1, gathered.
  rows = rb[:, None] + jnp.arange(cap)[None, :]                     # [B, cap], < R
  take = lambda a: jnp.take_along_axis(a, rows[..., None], axis=1)
  y_tail, state = kernel_call(cfg, backend, params, state, take(xbc), take(dt), tail_row,
                              None if z is None else take(z), cache_indices,
                              jnp.clip(n, 1, cap).astype(jnp.int32))
  y = y.at[jnp.arange(B)[:, None], rows].set(y_tail)[:, :R]
  # Every row set here: a rejected sequence's NaN, padding's 0 (the body kernels write only
  # its first Rp rows), a valid sequence's rows past its n 0.
  live = (jnp.arange(R)[None, :] < n[:, None]) & valid[:, None]
  y = jnp.where(live[..., None], y, jnp.where((valid | pad)[:, None, None], 0.0, jnp.nan))
  return y.astype(xbc.dtype), state


@functools.partial(jax.jit, static_argnames=("cfg", "backend", "chunked", "chunk_tiles",
                                             "entries_checked"),
                   donate_argnums=(1,))
def call(params, state, xbc, dt, state_row, z, cache_indices, num_rows, *, cfg, backend,
         chunked, chunk_tiles=None, entries_checked=True):
  """The jitted body of `verify` and `prefill`: the state (argument 1) is donated.

  Args as `m2v_jax.verify` after checking; `chunked` picks the chunked path (`use_chunked`),
  `chunk_tiles` overrides its tile table; `entries_checked=False` rejects the sequences of
  shared entries here (`status.reject_shared`). Returns (y, new state).
  """
  B, R, _ = xbc.shape
  if not entries_checked and cache_indices is not None and B > 1:
    cache_indices = status.reject_shared(jnp.asarray(cache_indices, jnp.int32),
                                         state.ssm.shape[0])
  # Params a user's jit closes over are constants; the barrier keeps XLA from folding
  # exp(A_log) at compile time (off by an ulp from the runtime exp), so all calls agree.
  params = lax.optimization_barrier(params)
  ragged_rows = num_rows
  cache_indices, num_rows = status.index_defaults(B, R, cache_indices, num_rows)
  if backend == config_lib.REFERENCE:
    fn = reference.compact_call if cfg.compact else reference.snapshot_call
    return fn(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows)
  if chunked:
    return chunked_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices,
                        ragged_rows, tiles=chunk_tiles)
  return kernel_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices,
                     num_rows)


@functools.partial(jax.jit, static_argnames=("cfg", "backend"))
def committed(params, state, state_row, cache_indices, *, cfg, backend):
  """The jitted body of `committed_state` (the pool is neither donated nor modified)."""
  B = state_row.shape[0]
  params = lax.optimization_barrier(params)   # as in `call`
  cache_indices, _ = status.index_defaults(B, 0, cache_indices, None)
  if backend == config_lib.REFERENCE or not cfg.compact:
    return reference.committed_state(cfg, params, state, state_row, cache_indices)
  E = state.ssm.shape[0]
  safe, valid, pad = status.entry_status(cfg, state, state_row, 0, cache_indices)
  # Fold a gathered copy of the B addressed entries, not the pool: the fold kernels alias
  # their state, so folding the (undonated) pool would copy all E entries.
  sub = CompactState(*(leaf[safe] for leaf in state))
  own = jnp.where((cache_indices >= 0) & (cache_indices < E), jnp.arange(B, dtype=jnp.int32), -2)
  folded = fold(cfg, backend, params, sub, state_row, own)
  return (reference.mask_invalid(folded.ssm.astype(f32), valid, pad),
          reference.mask_invalid(folded.conv, valid, pad))

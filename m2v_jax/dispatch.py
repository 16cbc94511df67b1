"""The backend and path of every op call: reference, verify kernels, or chunked prefill.

`call` and `committed` are the jitted entries of the ops, a call's arrays one
`status.CallArgs`; benchmarks, tools and tests call the functions here to run one path or tile
variant (docs/design.md, "A call").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from m2v_jax import checks
from m2v_jax import config as config_lib
from m2v_jax import params as params_lib
from m2v_jax import reference
from m2v_jax import status
from m2v_jax import tree as tree_lib
from m2v_jax.kernels import chunk_conv
from m2v_jax.kernels import chunk_scan
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels import verify as verify_kernels
from m2v_jax import state as state_lib
from m2v_jax.state import CompactState
from m2v_jax.status import CallArgs

f32 = jnp.float32

# Body rows from which `prefill` takes the chunked path by default: the ties of the verify
# kernels' body (32-row products) with the chunked scan, bf16 activations. Against the whole
# scan in one kernel (`ChunkTiles.fused_y`: Bolt's table entries; BENCHMARKS.md, "Session
# 53", "Session 54", "Session 56" and "Session 57", H100), serial / chunked time by body rows:
# - bf16 products: at B=1 0.84 at 29, 1.02 at 40, 1.13 at 96; at B=2 and 8 1.03 and 1.00 at
#   64, 1.23 and 1.15 at 128; at B=3, 4, 5 and 16 1.05, 1.01, 1.06 and 0.98 at 48, 1.05,
#   1.01, 1.07 and 0.99 at 64, 1.27, 1.19, 1.28 and 1.15 at 128 (the batched threshold stays
#   at 64: chunked, B=3 and 5 would gain 5-6% at 48 rows and B=16 lose 2%);
# - "highest" with bfloat16 activations (P tiles of 32 at B=1): at B=1 0.98 at 160, 1.08 at
#   192; at B=2 0.92-0.93 at 592-992, 1.00 at 1992, 1.01 at 4088; at B=3 1.08-1.09 at
#   1992-2992; at B=5 1.03 at 2992; at B=4 and 8 0.82-0.90 from 592 to 8184, at B=6, 12 and
#   16 0.88-0.92 at 1992-4088, at B=7 0.95 (within noise: 95% CI 0.92-1.02). So from 4
#   sequences the serial path runs bodies up to 8191 rows (past 8184 not measured, nor
#   B=9-11, 13-15 and above 16, nor compact mode; at B=5 and 2992 rows that costs 1.03x
#   the chunked time).
# Against the earlier kernels, which other entries still run ("Session 38" to "Session 41"):
# bf16 products 160 at B=1 and 360 above; float32 activations (not bf16 products; their
# serial products take more passes) 40; other 16-bit cases (tf32 products, float16
# activations, "highest" without the one kernel) 400.
MIN_CHUNKED_ROWS = 400
MIN_CHUNKED_ROWS_BF16 = 40
MIN_CHUNKED_ROWS_BF16_BATCHED = 64
MIN_CHUNKED_ROWS_BF16_KERNELS = 160
MIN_CHUNKED_ROWS_BF16_KERNELS_BATCHED = 360
MIN_CHUNKED_ROWS_HIGHEST_BF16 = 168
MIN_CHUNKED_ROWS_HIGHEST_BF16_BATCHED = 2048
MIN_CHUNKED_ROWS_HIGHEST_BF16_WIDE = 8192
HIGHEST_BF16_WIDE_BATCH = 4                 # sequences from which _WIDE applies
MIN_CHUNKED_ROWS_F32 = 40


_UNSUPPORTED = ("the chunked scan needs a power-of-two divisor of headdim >= 16 and dstate "
                ">= 16, got {cfg.headdim} and {cfg.dstate}")


def check_packed(cfg: config_lib.Mamba2Config, backend: str) -> None:
  """Raises ValueError where `prefill_packed` cannot run: the compiled chunked scan does not
  take the geometry."""
  if backend == config_lib.PALLAS and not chunk_scan.supported(cfg):
    raise ValueError(f"prefill_packed runs on the chunked path: {_UNSUPPORTED.format(cfg=cfg)} "
                     f"(use backend='reference' or 'interpret')")


def use_chunked(cfg: config_lib.Mamba2Config, backend: str, R: int, chunked: bool | None,
                dtype=jnp.float32, ragged: bool = False, batch: int = 1) -> bool:
  """Whether a prefill of `batch` sequences of R rows runs its body through the chunked scan:
  `chunked` if given, else on the kernel backends for bodies of at least `MIN_CHUNKED_ROWS`
  (with bf16 products `MIN_CHUNKED_ROWS_BF16` at B=1, `MIN_CHUNKED_ROWS_BF16_BATCHED` above,
  where the geometry's table entry runs the scan in one kernel, else
  `MIN_CHUNKED_ROWS_BF16_KERNELS[_BATCHED]`; "highest" with bfloat16 activations in one
  kernel `MIN_CHUNKED_ROWS_HIGHEST_BF16` at B=1, `[_BATCHED]` at B=2 and 3, `[_WIDE]` from
  `HIGHEST_BF16_WIDE_BATCH`; `MIN_CHUNKED_ROWS_F32` with float32 activations and other
  products). `batch` counts the call's sequences (padding entries too; under
  `sharding.sharded`, one device's). A ragged prefill (`num_rows` with R > capacity) must
  take it. Raises ValueError where the path asked for cannot run."""
  runs = chunk_scan.supported(cfg) or backend == config_lib.INTERPRET
  if chunked and not runs and backend == config_lib.PALLAS:
    raise ValueError(f"chunked: {_UNSUPPORTED.format(cfg=cfg)}")
  if ragged and backend != config_lib.REFERENCE:
    if chunked is False or not runs:
      raise ValueError(f"num_rows: a prefill of R={R} > capacity={cfg.capacity} rows with "
                       f"num_rows runs on the chunked path, which "
                       + ("chunked=False turns off" if chunked is False else
                          f"this geometry (headdim {cfg.headdim}, dstate {cfg.dstate}) "
                          f"does not take"))
    chunked = True
  if chunked is None:
    precision = cfg.prefill_precision_for(dtype)
    one_kernel = tiles_lib.chunk_tile_config(cfg, precision, dtype).fused_y
    if precision == config_lib.BF16 and one_kernel:
      min_rows = MIN_CHUNKED_ROWS_BF16 if batch == 1 else MIN_CHUNKED_ROWS_BF16_BATCHED
    elif precision == config_lib.BF16:
      min_rows = (MIN_CHUNKED_ROWS_BF16_KERNELS if batch == 1
                  else MIN_CHUNKED_ROWS_BF16_KERNELS_BATCHED)
    elif precision == config_lib.HIGHEST and jnp.dtype(dtype) == jnp.bfloat16 and one_kernel:
      min_rows = (MIN_CHUNKED_ROWS_HIGHEST_BF16 if batch == 1
                  else MIN_CHUNKED_ROWS_HIGHEST_BF16_BATCHED if batch < HIGHEST_BF16_WIDE_BATCH
                  else MIN_CHUNKED_ROWS_HIGHEST_BF16_WIDE)
    elif jnp.dtype(dtype) == jnp.float32:
      min_rows = MIN_CHUNKED_ROWS_F32
    else:
      min_rows = MIN_CHUNKED_ROWS
    chunked = runs and R - cfg.capacity >= min_rows
  return bool(chunked) and R > cfg.capacity and backend != config_lib.REFERENCE


def _unshared(args: CallArgs, E: int, entries_checked: bool) -> CallArgs:
  """args with every shared entry rejected (`status.reject_shared`), unless the host has
  ruled them out."""
  if entries_checked or args.cache_indices.shape[0] < 2:
    return args
  return args._replace(cache_indices=status.reject_shared(args.cache_indices, E))


def ragged_reference(cfg, params, state, args: CallArgs, host_rows, entries_checked=True):
  """A ragged prefill on the reference backend: one call per distinct length of `host_rows`,
  `args.num_rows` as host values (ValueError for device values); shared entries as in `call`."""
  if not checks.is_host(host_rows):
    raise ValueError("num_rows: a ragged prefill (R > capacity) on the reference backend "
                     "needs host values (it runs one call per distinct length)")
  host_rows = np.asarray(host_rows)
  B, R, _ = args.xbc.shape
  args = _unshared(args, state.ssm.shape[0], entries_checked)
  ci, z = args.cache_indices, args.z
  _, valid, _ = status.entry_status(cfg, state, R, args)
  y = jnp.zeros((B, R, cfg.d_inner), args.xbc.dtype)
  for n in np.unique(host_rows):
    member = jnp.asarray(host_rows == n)
    rows_n = status.call_args(args.xbc[:, :n], args.dt[:, :n], args.state_row,
                              None if z is None else z[:, :n], jnp.where(member, ci, -1))
    y_n, state = call(params, state, rows_n, cfg=cfg, backend=config_lib.REFERENCE,
                      chunked=False, ragged=False)
    y_n = jnp.pad(y_n, [(0, 0), (0, R - n), (0, 0)])
    y = jnp.where(member[:, None, None], y_n, y)
  return jnp.where(valid[:, None, None] | (ci < 0)[:, None, None], y, jnp.nan), state


def plan(cfg, backend, state, R, *, B, y_dtype, has_z=False, tiles=None, check_shared=False,
         tree=False, lead=False):
  """The verify kernels' static `Plan` of a call of R rows (0: a fold) on `state`."""
  return verify_kernels.Plan(
      cfg=cfg, R=R, E=state.ssm.shape[0], B=B, has_z=has_z, y_dtype=jnp.dtype(y_dtype),
      conv_dtype=jnp.dtype(state.conv.dtype),
      tiles=tiles or tiles_lib.tile_config(cfg, B, R, y_dtype),
      interpret=backend == config_lib.INTERPRET, state_dtype=jnp.dtype(state.ssm.dtype),
      check_shared=check_shared, tree=tree, lead=lead)


def check_tree(cfg, state, R):
  """Raises unless a draft tree of R rows can run on `state`: NotImplementedError for a
  compact window of more than 32 rows, ValueError for R > capacity."""
  if cfg.compact and not status.walks_paths(cfg):
    raise NotImplementedError(f"parents: compact-mode draft trees need a window of at most 32 "
                              f"rows (the pending rows' mask), got {cfg.window_rows}")
  if R > cfg.capacity:
    raise ValueError(f"parents: a draft tree is one verify call of at most capacity="
                     f"{cfg.capacity} rows, got R={R}")


def kernel_call(cfg, backend, params, state, args: CallArgs, tiles=None, entries_checked=True,
                parents=None, lead=None):
  """One call of the verify kernels, any R, either mode; returns (y [B, R, H*P], new state);
  with `lead`, y is `lead.y` with the call's rows written into it.

  `tiles` overrides the tile table; `entries_checked=False` has the conv launch reject shared
  entries (as `status.reject_shared` would, without a launch of its own). `parents` [B, R]
  int32 runs a draft tree (`reference.snapshot_tree_call`, `reference.compact_call`) of R <=
  capacity rows; the conv launch rejects a sequence whose parents break the rule
  (`tree.parent_ok`). `lead` (`verify.Lead`, a chunked prefill's tail): the call's rows are
  read from `lead`'s flat arrays at row `lead.end` (`args`' xbc, dt and z may then be
  `jax.ShapeDtypeStruct`s: only their shapes and dtypes are used), a sequence with body rows
  starts its conv from the window after its body instead of its state's, and each
  sequence's `lead.count` rows of y go into `lead.y` (`verify.run`).
  """
  B, R, _ = args.xbc.shape
  if parents is not None:
    check_tree(cfg, state, R)
  p = plan(cfg, backend, state, R, B=B, y_dtype=args.xbc.dtype, has_z=args.z is not None,
           tiles=tiles, check_shared=not entries_checked, tree=parents is not None,
           lead=lead is not None)
  return verify_kernels.run(p, params, state, args, parents, lead)


def fold(cfg, backend, params, state: CompactState, args: CallArgs):
  """Compact pre-pass on the kernels: folds window rows 0..state_row (a tree's: that row's
  path) into the base; `args`
  of a fold (R = 0: no rows, num_rows 0)."""
  B = args.state_row.shape[0]
  p = plan(cfg, backend, state, 0, B=B, y_dtype=state.win_xb.dtype)
  return verify_kernels.run(p, params, state, args)[1]


def chunk_plan(cfg, backend, state, T, S, y_dtype, has_z, max_body, tiles=None
               ) -> chunk_scan.ChunkPlan:
  """The chunked scan's static plan for S sequences in T flat rows; `tiles` overrides the
  table."""
  return chunk_scan.ChunkPlan(
      cfg=cfg, T=T, S=S, E=state.ssm.shape[0], has_z=has_z, y_dtype=jnp.dtype(y_dtype),
      tiles=tiles or tiles_lib.chunk_tile_config(cfg, cfg.prefill_precision_for(y_dtype),
                                                 y_dtype),
      interpret=backend == config_lib.INTERPRET, max_body=max_body)


def packed_slots(plan_: chunk_scan.ChunkPlan, base, n, span, trailing):
  """(body rows rb [S], `chunk_scan.Slots`) of S sequences at flat rows `base` with n rows and
  span rows reserved, the rows from `trailing` on filled; built on the host where `base`, n
  and span are numpy arrays and `trailing` an int (`chunk_scan.slot_table`)."""
  xp = np if isinstance(n, np.ndarray) else jnp
  rb = xp.maximum(n - plan_.cfg.capacity, 0).astype(np.int32)
  T = plan_.T
  return rb, chunk_scan.slot_table(
      plan_, chunk_scan.with_trailing(base, trailing), chunk_scan.with_trailing(n, 0),
      chunk_scan.with_trailing(span, T - trailing), chunk_scan.with_trailing(rb, 0))


def packed_call(cfg, backend, params, state, args: CallArgs, base, span, trailing, *, R,
                tiles=None):
  """A prefill of S sequences in flat rows (`args.xbc` [T, C], dt [T, H], z [T, H*P]):
  sequence s is rows base[s] .. + n - 1, n = `args.num_rows`[s] in [1, R] (else rejected),
  then span[s] - n rows of y to fill; rows from `trailing` on: y = 0. Where `args.num_rows`,
  base and span are numpy arrays and `trailing` an int, the layout is the host's: the slot
  table and each tail's first row are constants of the compiled call. Returns (y [T, H*P],
  new state)."""
  xbc, dt, z = args.xbc, args.dt, args.z
  state_row, ci = args.state_row, args.cache_indices
  T, S, cap = xbc.shape[0], state_row.shape[0], cfg.capacity
  i32 = jnp.int32
  _, valid, pad = status.entry_status(cfg, state, R, args)
  host = isinstance(trailing, int) and all(isinstance(a, np.ndarray)
                                           for a in (args.num_rows, base, span))
  xp = np if host else jnp
  if not host:
    base, span = jnp.asarray(base), jnp.asarray(span)
  n = xp.clip(args.num_rows, 0, span).astype(i32)
  p = chunk_plan(cfg, backend, state, T, S, xbc.dtype, z is not None, max(R - cap, 1), tiles)
  rb, slots = packed_slots(p, base, n, span, trailing)                # body rows of each
  # Snapshot with every n valid (known on the host): the kernels check the entry and
  # state_row themselves, as `status.entry_status` would (the tail's launch, the body conv).
  known = not cfg.compact and host and bool(np.all(status.rows_ok(args.num_rows, R)))
  if cfg.compact:
    # Fold only valid sequences with a body (a rejected one keeps its window).
    state = fold(cfg, backend, params, state, status.call_args(
        None, None, state_row, cache_indices=jnp.where(valid & (rb > 0), ci, -1)))
    tail_row = jnp.where(valid, jnp.where(rb > 0, 0, state_row), -1).astype(i32)
  elif known:
    tail_row = state_row
  else:
    tail_row = jnp.where(valid | pad, state_row, -1).astype(i32)   # -1: rejected
  slot0 = jnp.where(valid, state_row, 0)
  ssm, y, carry = state.ssm, None, None
  for seg in p.segments:            # one after the other: a segment's scratch, then the next's
    view = chunk_scan.segment_view(slots, seg)
    if known:                       # the body conv forms the per-sequence rows of the table
      zero = np.zeros((S,), np.int32)
      seqs = chunk_scan.CallSeqs(chunk_scan.seq_table(zero, zero, zero, view), ci, state_row)
    else:
      seqs = chunk_scan.seq_table(valid, ci, slot0, view)
    rows_in = xbc
    if y is not None:
      rows_in, y = lax.optimization_barrier((xbc, y))
    post, dts, seqs = chunk_conv.body_conv(p, seg, view, seqs, rows_in, dt, base, rb,
                                           state.conv, params.conv_weight, params.conv_bias,
                                           params.dt_bias)
    ssm, y, carry = chunk_scan.chunk_scan(p, seg, view, seqs, post, dts, z,
                                          params.A_log, params.D, ssm, y, carry)
  state = state._replace(ssm=ssm)
  # Each sequence's last m = min(n, cap) rows, from row base + rb: one verify call that reads
  # them from the flat rows and writes their y into y (the rows' arrays give it only their
  # shapes). Its conv starts from the window after each body, read from xbc (no body: from
  # its state, as a verify call does).
  m = xp.minimum(n, cap).astype(np.int32)
  rows = lambda a: None if a is None else jax.ShapeDtypeStruct((S, cap) + a.shape[1:], a.dtype)
  return kernel_call(cfg, backend, params, state, status.call_args(
      rows(xbc), rows(dt), tail_row, rows(z), ci, xp.clip(m, 1, cap)),
      lead=verify_kernels.Lead(xbc, dt, z, xp.asarray(base + rb, np.int32),
                               xp.asarray(rb, np.int32), y, m))


def chunked_call(cfg, backend, params, state, args: CallArgs, ragged: bool, tiles=None):
  """A prefill of B sequences of R > capacity rows (`args.xbc` [B, R, C]) on the chunked path:
  `packed_call` on the rows back to back. `ragged`: each sequence hands off at its own
  `num_rows` (else all at R). Returns (y [B, R, H*P], new state)."""
  B, R, C = args.xbc.shape
  if R <= cfg.capacity:
    raise ValueError(f"chunked prefill: needs R > capacity ({cfg.capacity}), got R={R}")
  flat = lambda a: None if a is None else a.reshape((B * R,) + a.shape[2:])
  n = args.num_rows if ragged else np.full((B,), R, np.int32)     # not ragged: the host's
  base = np.arange(B, dtype=np.int32) * R
  y, state = packed_call(
      cfg, backend, params, state,
      args._replace(xbc=flat(args.xbc), dt=flat(args.dt), z=flat(args.z), num_rows=n),
      base, np.full((B,), R, np.int32), B * R, R=R, tiles=tiles)
  return y.reshape(B, R, -1), state


@functools.partial(jax.jit, static_argnames=("cfg", "backend", "chunked", "ragged",
                                             "chunk_tiles", "entries_checked"),
                   donate_argnums=(1,))
def call(params, state, args: CallArgs, *, cfg, backend, chunked, ragged, chunk_tiles=None,
         entries_checked=True, parents=None):
  """The jitted body of `verify` and `prefill`, the state (argument 1) donated.

  `args` as `m2v_jax.verify`'s after checking, its defaults (`status.call_args`) applied here
  if they were not; `chunked` picks the chunked path, `ragged` its per-sequence hand-off at
  num_rows (the reference's is `ragged_reference`), `chunk_tiles` its tiles;
  `entries_checked=False` rejects shared entries on the device (in the conv launch on the
  verify kernels, by `status.reject_shared` otherwise). `parents` [B, R] int32 runs a draft
  tree (R <= capacity); a sequence whose parents break the rule (`tree.parent_ok`) is
  rejected (in the conv launch on the verify kernels, by `tree.valid_parents` otherwise).
  Raises ValueError for `ragged` without `chunked`.
  """
  if ragged and not chunked:
    raise ValueError("dispatch.call: ragged=True hands off at num_rows through the chunked "
                     "path; it needs chunked=True (the reference backend: ragged_reference)")
  args = status.call_args(*args)
  # Keeps XLA from constant-folding exp(A_log) (an ulp off the runtime exp) for closed-over params.
  params = lax.optimization_barrier(params)
  if parents is not None:
    if chunked:
      raise ValueError("dispatch.call: a draft tree (parents) is a verify call, not chunked")
    check_tree(cfg, state, args.xbc.shape[1])
  if backend != config_lib.REFERENCE and not chunked:   # the conv launch checks parents
    return kernel_call(cfg, backend, params, state, args, entries_checked=entries_checked,
                       parents=parents)
  args = _unshared(args, state.ssm.shape[0], entries_checked)
  if parents is not None:
    # num_rows -1 rejects the sequence by the one validity rule.
    args = args._replace(num_rows=jnp.where(tree_lib.valid_parents(parents), args.num_rows,
                                            -1))
    if cfg.compact:
      return reference.compact_call(cfg, params, state, args, parents)
    return reference.snapshot_tree_call(cfg, params, state, args, parents)
  if backend == config_lib.REFERENCE:
    fn = reference.compact_call if cfg.compact else reference.snapshot_call
    return fn(cfg, params, state, args)
  return chunked_call(cfg, backend, params, state, args, ragged, tiles=chunk_tiles)


def packed_layout(cu_seqlens, T):
  """(base, n, span, trailing) of `cu_seqlens` [S+1] in T rows: spans tile rows 0 ..
  trailing - 1; a prompt not starting at the furthest offset so far (0 for the first), empty
  or ending past T gets n = 0 (rejected)."""
  cu = cu_seqlens.astype(jnp.int32)
  reach = lax.cummax(jnp.clip(cu, 0, T).at[0].set(0))
  base, end = cu[:-1], cu[1:]
  ok = (base == reach[:-1]) & (end > base) & (end <= T)
  span = (reach[1:] - reach[:-1]).astype(jnp.int32)
  return reach[:-1], jnp.where(ok, end - base, 0).astype(jnp.int32), span, reach[-1]


@functools.partial(jax.jit, static_argnames=("cfg", "backend", "chunk_tiles",
                                             "entries_checked"), donate_argnums=(1,))
def packed(params, state, args: CallArgs, cu_seqlens, *, cfg, backend, chunk_tiles=None,
           entries_checked=True):
  """`prefill_packed`'s jitted body on the kernel backends (state donated): `args` of S
  prompts (xbc [T, C]; num_rows unused) at `cu_seqlens`."""
  T = args.xbc.shape[0]
  base, n, span, trailing = packed_layout(cu_seqlens, T)
  args = status.call_args(args.xbc, args.dt, args.state_row, args.z, args.cache_indices, n,
                          R=T)
  args = _unshared(args, state.ssm.shape[0], entries_checked)
  params = lax.optimization_barrier(params)   # as in `call`
  return packed_call(cfg, backend, params, state, args, base, span, trailing, R=T,
                     tiles=chunk_tiles)


def packed_reference(cfg, params, state, args: CallArgs, cu_seqlens, entries_checked=True):
  """`prefill_packed` on the reference backend: the prompts padded to the longest, one
  `ragged_reference` call (host `cu_seqlens`; ValueError for device values)."""
  if not checks.is_host(cu_seqlens):
    raise ValueError("cu_seqlens: a packed prefill on the reference backend (the default "
                     "without a GPU) needs host values; pass them from the host, or use "
                     "backend='interpret' (or 'pallas' on a GPU) for device offsets")
  cu = np.asarray(cu_seqlens)
  n, T = np.diff(cu), args.xbc.shape[0]
  L = int(n.max())
  rows = np.minimum(cu[:-1, None] + np.arange(L)[None, :], T - 1)        # [S, L]
  pad = lambda a: None if a is None else a[rows]
  padded = status.call_args(pad(args.xbc), pad(args.dt), args.state_row, pad(args.z),
                            args.cache_indices, n.astype(np.int32))
  if L > cfg.capacity:
    y, state = ragged_reference(cfg, params, state, padded, n, entries_checked)
  else:
    y, state = call(params, state, padded, cfg=cfg, backend=config_lib.REFERENCE,
                    chunked=False, ragged=False, entries_checked=entries_checked)
  own = np.arange(L)[None, :] < n[:, None]
  out = jnp.zeros((T, cfg.d_inner), args.xbc.dtype)
  return out.at[rows[own]].set(y[own].astype(out.dtype)), state


@functools.partial(jax.jit, static_argnames=("cfg", "backend"))
def committed(params, state, args: CallArgs, *, cfg, backend):
  """The jitted body of `committed_state` on a fold's `args` (R = 0; defaults applied here if
  they were not); the pool is neither donated nor modified."""
  args = status.call_args(*args)
  params = lax.optimization_barrier(params)   # as in `call`
  if backend == config_lib.REFERENCE or not cfg.compact:
    return reference.committed_state(cfg, params, state, args)
  B = args.state_row.shape[0]
  E = state.ssm.shape[0]
  ci = args.cache_indices
  safe, valid, pad = status.entry_status(cfg, state, 0, args)
  # Fold a gathered copy of the B entries: folding the undonated pool would copy all E.
  sub = CompactState(*(leaf[safe] for leaf in state))
  own = jnp.where(status.in_pool(ci, E), jnp.arange(B, dtype=jnp.int32), -2)
  folded = fold(cfg, backend, params, sub, args._replace(cache_indices=own))
  return (reference.mask_invalid(folded.ssm.astype(f32), valid, pad),
          reference.mask_invalid(folded.conv, valid, pad))


def abstract_call_args(cfg, B, R, z=False, dtype=jnp.bfloat16, E=None):
  """`call`'s (params, state, args) for R rows on B sequences (E entries, default B) without
  allocating: random params, then shapes (z None unless `z`). For lowering on any machine
  (`backend.triton_kernels`)."""
  E = E or B
  sds = jax.ShapeDtypeStruct
  i32 = sds((B,), jnp.int32)
  args = CallArgs(xbc=sds((B, R, cfg.conv_dim), dtype), dt=sds((B, R, cfg.nheads), dtype),
                  state_row=i32, z=sds((B, R, cfg.d_inner), dtype) if z else None,
                  cache_indices=i32, num_rows=i32)
  return params_lib.random_params(cfg), state_lib.state_shapes(cfg, E, dtype), args

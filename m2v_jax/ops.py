"""Public ops: verify and prefill calls in both replay modes, committed states, checks.

Every op is functional and `jax.jit`-friendly: it takes the state pytree and returns the new
one. Called eagerly, each op is its own jit that donates the state, so the pool is updated in
place (the kernels alias it, `input_output_aliases`); inside a caller's jit, donate the state
at that outermost jit (`donate_argnums`), otherwise XLA inserts one copy of the pool.

Validation (SPEC §6) happens before anything runs, so a rejected call loses no state:
- shapes, dtypes, group counts, R above a verify call's capacity: ValueError / TypeError at
  trace time naming the argument, what was expected and what came;
- `state_row` (and `cache_indices`, `num_rows`) given as host values (Python ints, lists,
  NumPy arrays) and out of range: ValueError naming the sequence and the allowed range;
- device values out of range: no out-of-bounds access; that sequence's entry is left exactly
  as it was and its y rows are NaN. `verify_checked` additionally returns a checkify error
  naming the first bad sequence.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from m2v_jax import config as config_lib
from m2v_jax import params as params_lib
from m2v_jax import prefill_kernels
from m2v_jax import reference
from m2v_jax import state as state_lib
from m2v_jax import verify_kernels
from m2v_jax.state import CompactState, SnapshotState

Mamba2Config = config_lib.Mamba2Config


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _desc(a) -> str:
  return f"{jnp.dtype(a.dtype).name}{list(a.shape)}"


def _expect(name, a, shape, dtypes):
  if a is None:
    raise ValueError(f"{name}: expected an array of shape {list(shape)}, got None")
  if not hasattr(a, "shape") or not hasattr(a, "dtype"):
    raise TypeError(f"{name}: expected an array, got {type(a).__name__}")
  if tuple(a.shape) != tuple(shape):
    raise ValueError(f"{name}: expected shape {list(shape)}, got {list(a.shape)}")
  dtypes = [jnp.dtype(d) for d in dtypes]
  if jnp.dtype(a.dtype) not in dtypes:
    raise TypeError(f"{name}: expected dtype {' or '.join(d.name for d in dtypes)}, "
                    f"got {jnp.dtype(a.dtype).name}")


def _is_host(a) -> bool:
  return isinstance(a, (int, np.integer, np.ndarray, list, tuple))


def _host_int_array(name, a, B):
  arr = np.asarray(a)
  if arr.ndim == 0:
    arr = np.full((B,), arr)
  if not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f"{name}: expected integers, got {arr.dtype}")
  if arr.shape != (B,):
    raise ValueError(f"{name}: expected shape [{B}], got {list(arr.shape)}")
  info = np.iinfo(np.int32)
  bad = np.flatnonzero((arr < info.min) | (arr > info.max))
  if bad.size:
    raise ValueError(f"{name}[{bad[0]}]={arr[bad[0]]}: expected an int32 value")
  return arr.astype(np.int32)


def _check_state(cfg: Mamba2Config, state, dtype):
  expected_type = SnapshotState if cfg.replay_mode == config_lib.SNAPSHOT else CompactState
  if not isinstance(state, expected_type):
    raise TypeError(f"state: cfg.replay_mode={cfg.replay_mode!r} expects "
                    f"{expected_type.__name__}, got {type(state).__name__}")
  E = state.ssm.shape[0]
  conv_dtypes = (jnp.float32, dtype)
  shapes = state_lib.state_shapes(cfg, E, dtype, state.conv.dtype
                                  if jnp.dtype(state.conv.dtype) in map(jnp.dtype, conv_dtypes)
                                  else jnp.float32)
  for name in type(state)._fields:
    want = getattr(shapes, name)
    dts = conv_dtypes if name == "conv" else (want.dtype,)
    _expect(f"state.{name}", getattr(state, name), want.shape, dts)
  return E


def _check_call(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, *,
                verify: bool):
  """Static checks plus host-value range checks; returns normalized index arguments."""
  if not isinstance(cfg, Mamba2Config):
    raise TypeError(f"cfg: expected m2v_jax.Mamba2Config, got {type(cfg).__name__}")
  params_lib.check_params(cfg, params)
  if not hasattr(xbc, "ndim") or xbc.ndim != 3:
    raise ValueError(f"xbc: expected a [B, R, conv_dim={cfg.conv_dim}] array, got "
                     f"{_desc(xbc) if hasattr(xbc, 'shape') else type(xbc).__name__}")
  B, R, _ = xbc.shape
  if R < 1:
    raise ValueError(f"xbc: expected at least one row, got R={R}")
  _expect("xbc", xbc, (B, R, cfg.conv_dim), state_lib.ACTIVATION_DTYPES)
  _expect("dt", dt, (B, R, cfg.nheads), state_lib.ACTIVATION_DTYPES)
  if z is not None:
    _expect("z", z, (B, R, cfg.d_inner), (xbc.dtype,))
  if verify and R > cfg.capacity:
    raise ValueError(f"xbc: a verify call takes at most capacity={cfg.capacity} rows, got R={R} "
                     f"(use m2v_jax.prefill for longer chunks)")
  E = _check_state(cfg, state, xbc.dtype)

  cache_indices = _check_cache_indices(cache_indices, B, E)

  if num_rows is not None:
    if R > cfg.capacity:
      raise ValueError(f"num_rows: only for calls of R <= capacity={cfg.capacity} rows, got R={R}")
    if _is_host(num_rows):
      nr = _host_int_array("num_rows", num_rows, B)
      for b, n in enumerate(nr):
        if not 1 <= n <= R:
          raise ValueError(f"num_rows[{b}]={n}: expected 1 <= num_rows <= R={R}")
      num_rows = nr
    else:
      _expect("num_rows", num_rows, (B,), (jnp.int32,))

  state_row = _check_state_row(cfg, state, state_row, B, cache_indices)
  return state_row, cache_indices, num_rows


def _check_cache_indices(cache_indices, B, E):
  if cache_indices is None:
    if E != B:
      raise ValueError(f"cache_indices: required when the pool has {E} entries for a batch of {B}")
    return None
  if not _is_host(cache_indices):
    _expect("cache_indices", cache_indices, (B,), (jnp.int32,))
    return cache_indices
  ci = _host_int_array("cache_indices", cache_indices, B)
  for b, e in enumerate(ci):
    if not -1 <= e < E:
      raise ValueError(f"cache_indices[{b}]={e}: expected -1 (padding) or 0 <= index < {E}")
  live = ci[ci >= 0]
  if len(np.unique(live)) != len(live):
    raise ValueError(f"cache_indices: an entry appears twice in one call: {ci.tolist()}")
  return ci


def _check_state_row(cfg, state, state_row, B, cache_indices):
  if not _is_host(state_row):
    _expect("state_row", state_row, (B,), (jnp.int32,))
    return state_row
  rows = _host_int_array("state_row", state_row, B)
  host_entries = cache_indices is None or _is_host(cache_indices)
  entries = np.arange(B) if cache_indices is None else (
      np.asarray(cache_indices) if host_entries else np.zeros(B, np.int32))
  pending = None
  if (cfg.replay_mode == config_lib.COMPACT and host_entries
      and not isinstance(state.pending, jax.core.Tracer)):
    pending = np.asarray(state.pending)          # the exact rule needs the pending counts
  for b, r in enumerate(rows):
    if entries[b] < 0:
      continue
    if cfg.replay_mode == config_lib.SNAPSHOT:
      if not 0 <= r < cfg.capacity:
        raise ValueError(f"state_row[{b}]={r}: expected 0 <= state_row < S={cfg.capacity}")
    elif pending is None:
      if not 0 <= r < cfg.capacity:
        raise ValueError(f"state_row[{b}]={r}: expected 0 <= state_row < W={cfg.capacity}")
    else:
      p = int(pending[entries[b]])
      if p > 0 and not 0 <= r < p:
        raise ValueError(f"state_row[{b}]={r}: expected 0 <= state_row < {p} "
                         f"(the rows pending for that sequence)")
      if p == 0 and r != 0:
        raise ValueError(f"state_row[{b}]={r}: expected 0 (nothing is pending for that sequence)")
  return rows


# ----------------------------------------------------------------------------------------------
# Calls
# ----------------------------------------------------------------------------------------------


def _plan(cfg, backend, state, xbc, R, z, tiles=None, B=None):
  """The kernels' static plan; a fold (R = 0) passes no xbc and gives B."""
  return verify_kernels.Plan(
      cfg=cfg, R=R, E=state.ssm.shape[0], B=B if xbc is None else xbc.shape[0],
      has_z=z is not None, y_dtype=jnp.dtype(state.win_xbc.dtype if xbc is None else xbc.dtype),
      conv_dtype=jnp.dtype(state.conv.dtype), tiles=tiles or config_lib.tile_config(cfg),
      interpret=backend == config_lib.INTERPRET)


def _kernel_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices, num_rows,
                 tiles=None):
  """One serial kernel call (any R) in either mode; `tiles` overrides the tile table."""
  B, R, _ = xbc.shape
  plan = _plan(cfg, backend, state, xbc, R, z, tiles)
  return verify_kernels.run(plan, params, state, xbc, dt, state_row, z, cache_indices,
                            num_rows)


@functools.partial(jax.jit, static_argnames=("cfg", "backend", "chunked", "chunk_tiles"),
                   donate_argnums=(1,))
def _call(params, state, xbc, dt, state_row, z, cache_indices, num_rows, *, cfg, backend,
          chunked, chunk_tiles=None):
  B, R, _ = xbc.shape
  cache_indices, num_rows = verify_kernels.index_defaults(B, R, cache_indices, num_rows)
  if backend == config_lib.REFERENCE:
    fn = reference.snapshot_call if isinstance(state, SnapshotState) else reference.compact_call
    return fn(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows)
  if chunked:
    return prefill_kernels.chunked_call(cfg, backend, params, state, xbc, dt, state_row, z,
                                        cache_indices, _kernel_call, fold_kernel,
                                        tiles=chunk_tiles)
  return _kernel_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices,
                      num_rows)


def verify(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt, state_row, *,
           z=None, cache_indices=None, num_rows=None, backend: str | None = None):
  """Runs R <= capacity rows (the last token and R-1 drafts) through the conv and the SSM.

  Snapshot mode (SPEC §3): starts from slot `state_row[b]` of entry `cache_indices[b]` and
  writes the state after row r to slot r (r < R; slots >= R untouched). Compact mode
  (SPEC §4): folds pending window rows 0..state_row[b] into the base, writes that start state
  as the new base, runs the R rows from it and keeps them pending. In both modes `state_row`
  is the index of the last accepted row of the previous call. y and the states are bitwise
  the same in both modes (same backend, S == W).

  Args:
    cfg: geometry and mode (`cfg.replay_mode`; `cfg.capacity` = S or W).
    params: the layer's `LayerParams` (float32).
    state: `SnapshotState` or `CompactState` pool with E entries; donated when called eagerly.
    xbc: [B, R, C] raw (pre-conv) `[x | B | C]` inputs; float32, bfloat16 or float16.
    dt: [B, R, H] raw dt (before dt_bias and softplus); any of those float dtypes.
    state_row: [B] int32: the starting row (see above). Host values are range-checked.
    z: optional [B, R, H*P] gate in xbc's dtype; y *= silu(z). (Nemotron-style models pass
      none and apply a gated RMSNorm outside.)
    cache_indices: optional [B] int32 pool entries; -1 marks padding (nothing read or
      written, y = 0). Default `arange(B)` (then E must equal B).
    num_rows: optional [B] int32 in [1, R]: rows past a sequence's count leave its state
      unchanged (snapshot: slots >= num_rows untouched; compact: only num_rows pending) and
      give y = 0.
    backend: "pallas", "interpret", "reference", or None (pallas on GPU, else reference).

  Returns:
    (y [B, R, H*P] in xbc's dtype, the new state). y rows of a sequence whose device-side
    `state_row`/entry/`num_rows` is invalid are NaN, and its entry is left exactly as it was.

  Raises:
    ValueError / TypeError: as listed in the module docstring, before anything runs.
  """
  backend = config_lib.resolve_backend(backend)
  state_row, cache_indices, num_rows = _check_call(
      cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, verify=True)
  _check_backend(cfg, backend)
  return _call(params, state, xbc, dt, jnp.asarray(state_row, jnp.int32), z, cache_indices,
               num_rows, cfg=cfg, backend=backend, chunked=False)


def prefill(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt, state_row, *,
            z=None, cache_indices=None, backend: str | None = None, chunked: bool | None = None,
            chunk_tiles: config_lib.ChunkTiles | None = None):
  """Runs a chunk of any length R >= 1 and hands off to the next call like a verify call.

  Snapshot mode: slot s holds the state after row R - S + s (R > S), or after row s (R <= S).
  Compact mode: any pending window is folded at `state_row` first (the pre-pass), rows
  0..R-W-1 are committed into the base and the last min(R, W) rows are left pending. The next
  call picks its `state_row` among the last min(R, capacity) rows in both modes.

  Rows 0..R-capacity-1 run through the chunked SSD scan when `chunked` (default: when
  R - capacity >= 64 on the kernel backends); the last capacity rows always run through the
  serial kernel, in both modes alike, so the modes stay bitwise identical across a prefill.

  Args, returns and errors: as `verify` (no `num_rows`), plus `chunked` (ignored by the
  reference backend, which always runs the serial recurrence) and `chunk_tiles` (a
  `ChunkTiles` overriding the measured table, `config.chunk_tile_config`). The chunked scan
  needs a power-of-two divisor of headdim >= 16 and dstate >= 16 (Triton's smallest dot);
  other geometries run serially, and `chunked=True` for them raises ValueError, as do
  `chunk_tiles` whose chunk is shorter than the conv state (K-1 rows) or, compiled, whose
  chunk or local_block_p is below 16. Its float32
  scratch grows with B x R (about 0.71 GB per sequence at Bolt geometry and R = 4096; see
  `prefill_kernels`).
  """
  backend = config_lib.resolve_backend(backend)
  state_row, cache_indices, _ = _check_call(
      cfg, params, state, xbc, dt, state_row, z, cache_indices, None, verify=False)
  _check_backend(cfg, backend)
  R = xbc.shape[1]
  if chunked and not prefill_kernels.supported(cfg) and backend == config_lib.PALLAS:
    raise ValueError(f"chunked: the chunked scan needs a power-of-two divisor of headdim "
                     f">= 16 and dstate >= 16, got {cfg.headdim} and {cfg.dstate}")
  if chunked is None:
    chunked = (R - cfg.capacity >= prefill_kernels.MIN_ROWS
               and (prefill_kernels.supported(cfg) or backend == config_lib.INTERPRET))
  chunked = bool(chunked) and R > cfg.capacity and backend != config_lib.REFERENCE
  return _call(params, state, xbc, dt, jnp.asarray(state_row, jnp.int32), z, cache_indices,
               None, cfg=cfg, backend=backend, chunked=chunked,
               chunk_tiles=chunk_tiles if chunked else None)


def _check_backend(cfg, backend):
  if backend != config_lib.REFERENCE and cfg.dstate & (cfg.dstate - 1):
    raise ValueError(f"cfg.dstate: the Pallas kernels need a power of two, got {cfg.dstate} "
                     f"(use backend='reference')")


# ----------------------------------------------------------------------------------------------
# Committed states, conversions, checked calls
# ----------------------------------------------------------------------------------------------


def fold_kernel(cfg, backend, params, state: CompactState, state_row, cache_indices):
  """Compact pre-pass on the kernels: folds window rows 0..state_row into the base.

  Returns the new CompactState (pending counts of valid sequences set to 0).
  """
  B = state_row.shape[0]
  plan = _plan(cfg, backend, state, None, 0, None, B=B)
  zeros = jnp.zeros((B,), jnp.int32)
  return verify_kernels.run(plan, params, state, None, None, state_row, None, cache_indices,
                            zeros)[1]


@functools.partial(jax.jit, static_argnames=("cfg", "backend"))
def _committed(params, state, state_row, cache_indices, *, cfg, backend):
  B = state_row.shape[0]
  cache_indices, _ = verify_kernels.index_defaults(B, 0, cache_indices, None)
  if backend == config_lib.REFERENCE or isinstance(state, SnapshotState):
    return reference.committed_state(cfg, params, state, state_row, cache_indices)
  E = state.ssm.shape[0]
  safe, valid, _ = verify_kernels.entry_status(cfg, state, state_row, 0, cache_indices)
  # Fold a gathered copy of the B addressed entries, not the pool: the fold kernels alias
  # their state, so folding the (undonated) pool would copy all E entries.
  sub = CompactState(*(leaf[safe] for leaf in state))
  own = jnp.where((cache_indices >= 0) & (cache_indices < E), jnp.arange(B, dtype=jnp.int32), -2)
  folded = fold_kernel(cfg, backend, params, sub, state_row, own)
  return reference.mask_invalid(folded.ssm, valid), reference.mask_invalid(folded.conv, valid)


def committed_state(cfg: Mamba2Config, params: params_lib.LayerParams, state, state_row, *,
                    cache_indices=None, backend: str | None = None):
  """The committed state at `state_row` of each sequence, in either mode (prefix-cache capture).

  Snapshot: slot `state_row[b]`. Compact: the base with window rows 0..state_row[b] folded in,
  computed with the same kernel arithmetic as a verify call, so the result is bitwise the
  state the next call would start from. The state pool is not modified (nor donated).

  Args:
    cfg, params: as `verify`.
    state: either mode's pool.
    state_row: [B] int32, the last accepted row (compact with nothing pending: 0).
    cache_indices: optional [B] int32 entries (default arange(B), E == B).
    backend: as `verify`.

  Returns:
    (ssm [B, H, P, N] float32, conv [B, C, K-1] in the state's conv dtype); NaN for a
    sequence whose device-side `state_row` or entry is invalid.

  Raises:
    ValueError / TypeError: wrong shapes or dtypes, host `state_row` out of range.
  """
  backend = config_lib.resolve_backend(backend)
  if not isinstance(cfg, Mamba2Config):
    raise TypeError(f"cfg: expected m2v_jax.Mamba2Config, got {type(cfg).__name__}")
  params_lib.check_params(cfg, params)
  _check_backend(cfg, backend)
  _check_state(cfg, state, _activation_dtype(state))
  E = state.ssm.shape[0]
  B = np.shape(state_row)[0] if np.ndim(state_row) else E
  cache_indices = _check_cache_indices(cache_indices, B, E)
  state_row = _check_state_row(cfg, state, state_row, B, cache_indices)
  return _committed(params, state, jnp.asarray(state_row, jnp.int32),
                    None if cache_indices is None else jnp.asarray(cache_indices, jnp.int32),
                    cfg=cfg, backend=backend)


def convert_state(cfg: Mamba2Config, params: params_lib.LayerParams, state, state_row,
                  to_cfg: Mamba2Config, *, dtype=None, backend: str | None = None):
  """Converts a pool between the modes through its committed states (E == B).

  The new pool starts every entry from the committed state at `state_row`; the next call
  uses `state_row = 0`.

  Args:
    dtype: activation dtype of the calls that follow. Default: a compact pool's window
      dtype, or a snapshot pool's conv dtype (pass it when that conv state is float32 and
      the activations are not).

  Raises:
    ValueError: `to_cfg` with another geometry.
  """
  if dict(vars(cfg), replay_mode=None, capacity=None) != dict(vars(to_cfg), replay_mode=None,
                                                                capacity=None):
    raise ValueError(f"to_cfg: expected the geometry of cfg, got {to_cfg} for {cfg}")
  ssm, conv = committed_state(cfg, params, state, state_row, backend=backend)
  return state_lib.state_from_committed(to_cfg, ssm, conv, dtype or _activation_dtype(state))


def _activation_dtype(state):
  """The activation dtype a pool implies: the compact window's, else the conv state's."""
  return state.win_xbc.dtype if isinstance(state, CompactState) else state.conv.dtype


def invalid_sequences(cfg: Mamba2Config, state, state_row, R: int, *, cache_indices=None,
                      num_rows=None):
  """[B] bool on the device: the sequences a call of R rows would reject (padding excluded).

  Reasons: `state_row` out of range (snapshot: [0, S); compact: [0, pending), or exactly 0
  with nothing pending), an entry outside the pool, `num_rows` outside [1, R].
  """
  _, valid, pad = verify_kernels.entry_status(cfg, state, jnp.asarray(state_row, jnp.int32), R,
                                              cache_indices, num_rows)
  return ~valid & ~pad


def verify_checked(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt,
                   state_row, **kwargs):
  """`verify` plus a `checkify.Error` that names the first sequence the call rejected.

  Returns:
    (y, new_state, err). `err.throw()` raises an error (checkify's) with a message like
    "state_row rejected for sequence 2: state_row=9 ..." if any sequence was invalid (the
    results are still those of `verify`: that sequence untouched, its y NaN). `err.get()`
    returns the message or None without raising. Checking costs a device-to-host read when
    the caller inspects `err`, not before.
  """
  bad = invalid_sequences(cfg, state, jnp.asarray(state_row, jnp.int32), xbc.shape[1],
                          cache_indices=kwargs.get("cache_indices"),
                          num_rows=kwargs.get("num_rows"))
  first = jnp.argmax(bad).astype(jnp.int32)
  row = jnp.asarray(state_row, jnp.int32)[first]
  if isinstance(state, CompactState):
    ci, _ = verify_kernels.index_defaults(bad.shape[0], 0, kwargs.get("cache_indices"), None)
    pend = state.pending[jnp.clip(ci[first], 0, state.ssm.shape[0] - 1)]
  else:
    pend = jnp.int32(cfg.capacity)

  def check(b, r, p):
    checkify.check(b < 0, "state_row rejected for sequence {s}: state_row={r}, allowed "
                   "0 <= state_row < {p} (or exactly 0 with nothing pending), or its "
                   "cache entry / num_rows is out of range", s=b, r=r, p=p)

  err, _ = checkify.checkify(check)(jnp.where(jnp.any(bad), first, -1), row, pend)
  y, new_state = verify(cfg, params, state, xbc, dt, state_row, **kwargs)
  return y, new_state, err

"""The public ops: check the arguments, then dispatch.

Every op is functional and `jax.jit`-friendly: it takes the state pytree and returns the new
one. Called eagerly, `verify` and `prefill` run one jitted function that donates the state,
so the pool is updated in place (the kernels alias it, `input_output_aliases`); inside a
caller's jit, donate the state at that outermost jit (`donate_argnums`), otherwise XLA
inserts one copy of the pool.

Bad input (see `m2v_jax.checks` and `m2v_jax.status`):
- shapes, dtypes, group counts, R above a verify call's capacity: ValueError / TypeError at
  trace time naming the argument, what was expected and what came;
- `state_row` (and `cache_indices`, `num_rows`) given as host values (Python ints, lists,
  NumPy arrays) and out of range: ValueError naming the sequence and the allowed range
  (compact `state_row`: the static range [0, capacity); the pending-count rule is checked on the
  device, as below, so no call reads the pool back to the host);
- device values out of range: no out-of-bounds access; that sequence's entry is left exactly
  as it was and its y rows are NaN. `verify_checked` additionally returns a checkify error
  naming the first bad sequence.
A rejected call raises before anything runs, so it loses no state.
"""

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
           z=None, cache_indices=None, num_rows=None, backend: str | None = None):
  """Runs R <= capacity rows (the last token and R-1 drafts) through the conv and the SSM.

  Snapshot mode: starts from slot `state_row[b]` of entry `cache_indices[b]` and writes the
  state after row r to slot r (r < R; slots >= R untouched). Compact mode: folds pending
  window rows 0..state_row[b] into the base, writes that start state as the new base, runs
  the R rows from it and keeps them pending. In both modes `state_row` is the index of the
  last accepted row of the previous call. y and the states are bitwise the same in both modes
  (same backend, S == W; one exception, docs/semantics.md: 16-bit state with float32
  activations, compiled). The math of one row is in docs/semantics.md (Mamba-2: Dao & Gu,
  "Transformers are SSMs", 2024; the step of state-spaces/mamba's `Mamba2`); y of the call's
  rows comes from its start state in the SSD dual form, on the tensor cores with
  float32-accurate products, so it equals R one-row calls' to float32 rounding (the states
  bitwise).

  Args:
    cfg: geometry and mode (`cfg.replay_mode`; `cfg.capacity` = S or W).
    params: the layer's `LayerParams` (float32).
    state: `SnapshotState` or `CompactState` pool with E entries; donated when called eagerly.
      Its `ssm` leaf is float32 or a 16-bit `state_dtype` (`init_state`): stored rounded,
      computed in float32 (then one R-row call no longer equals R one-row calls; the modes
      stay bitwise identical).
    xbc: [B, R, C] raw (pre-conv) `[x | B | C]` inputs; float32, bfloat16 or float16.
    dt: [B, R, H] raw dt (before dt_bias and softplus); any of those float dtypes.
    state_row: [B] int32: the starting row (see above). Host values are range-checked
      ([0, capacity); see the module docstring).
    z: optional [B, R, H*P] gate in xbc's dtype; y *= silu(z). (Nemotron-style models pass
      none and apply a gated RMSNorm outside.)
    cache_indices: optional [B] int32 pool entries; -1 marks padding (nothing read or
      written, y = 0). Default `arange(B)` (then E must equal B). A live entry must not
      appear twice in one call: host values raise ValueError; in a device array, every
      sequence addressing a shared entry is rejected (y NaN, the entry untouched).
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
  state_row, cache_indices, num_rows = checks.call(
      cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, verify=True)
  checks.backend(cfg, backend)
  return dispatch.call(params, state, xbc, dt, jnp.asarray(state_row, jnp.int32), z,
                       cache_indices, num_rows, cfg=cfg, backend=backend, chunked=False,
                       entries_checked=checks.entries_checked(cache_indices))


def prefill(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt, state_row, *,
            z=None, cache_indices=None, num_rows=None, backend: str | None = None,
            chunked: bool | None = None, chunk_tiles: tiles_lib.ChunkTiles | None = None):
  """Runs a chunk of any length R >= 1 and hands off to the next call like a verify call.

  Snapshot mode: slot s holds the state after row R - S + s (R > S), or after row s (R <= S).
  Compact mode: any pending window is folded at `state_row` first (the pre-pass), rows
  0..R-capacity-1 are committed into the base and the last min(R, capacity) rows are left
  pending. The next
  call picks its `state_row` among the last min(R, capacity) rows in both modes.

  Rows 0..R-capacity-1 run through the chunked SSD scan (Mamba-2 paper, §6) when `chunked`
  (default: when R - capacity >= `dispatch.MIN_CHUNKED_ROWS`, or `MIN_CHUNKED_ROWS_BF16`
  with bf16 products, on the kernel backends); the last capacity rows always run through
  the verify kernels, in both modes alike, so the modes stay bitwise identical across a
  prefill. The chunked body is a different algorithm, with its matmul products at
  `cfg.prefill_precision` (by default chosen by the activation dtype): at "highest" it
  matches the serial recurrence within float32 rounding (relative error below 1e-5); with
  bf16 products the final state is within about 1e-3 (docs/design.md, "Prefill precision").

  Ragged prefill: `num_rows` [B] in [1, R] gives each sequence its own prompt length n (rows
  n.. are padding: not read, y = 0 there). Every sequence hands off exactly as a prefill of
  its own n rows would: snapshot slot s holds the state after row n - S + s (n > S) or row s
  (n <= S; slots >= n untouched); compact mode keeps its last min(n, capacity) rows pending
  (a sequence of n <= capacity rows runs as a verify call of n rows, with no pre-pass). With
  R > capacity the kernel backends take the chunked path (the body rows of each sequence
  run, the chunks wholly past them are skipped; then each sequence's last rows run
  serially); the reference backend runs one call per distinct length and so needs host
  `num_rows`. The hand-off is that of a prefill of n rows; the numbers are the chunked
  path's (at `prefill_precision`) even for a short body that a prefill of n rows alone
  would run serially.

  Args, returns and errors: as `verify`, plus `chunked` (ignored by the reference backend,
  which always runs the serial recurrence) and `chunk_tiles` (a `ChunkTiles` overriding the
  measured table, `chunk_tile_config`). The chunked scan needs a
  power-of-two divisor of headdim >= 16 and dstate >= 16 (Triton's smallest dot); other
  geometries run serially, and `chunked=True` for them raises ValueError on the pallas
  backend, as do `chunk_tiles` whose chunk is shorter than the conv state (K-1 rows) or,
  compiled, whose chunk or local_block_p is below 16; a ragged prefill with R > capacity
  raises ValueError with `chunked=False`, and on the pallas backend for a geometry the
  chunked scan does not take, and on the reference backend for device `num_rows`. Its
  scratch grows with B x R (per sequence at Bolt geometry and R = 4096: about 0.37 GB with
  bf16 activations, 0.71 GB with float32; `kernels.chunk_scan.scratch_bytes`): split large
  batches of long prompts.
  """
  backend = config_lib.resolve_backend(backend)
  state_row, cache_indices, num_rows = checks.call(
      cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows, verify=False)
  checks.backend(cfg, backend)
  R = xbc.shape[1]
  ragged = num_rows is not None and R > cfg.capacity
  if chunked and not dispatch.chunk_scan.supported(cfg) and backend == config_lib.PALLAS:
    raise ValueError(f"chunked: the chunked scan needs a power-of-two divisor of headdim "
                     f">= 16 and dstate >= 16, got {cfg.headdim} and {cfg.dstate}")
  if ragged and backend == config_lib.REFERENCE:
    return _ragged_reference(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows)
  if ragged:
    if chunked is False or not (dispatch.chunk_scan.supported(cfg) or
                                backend == config_lib.INTERPRET):
      raise ValueError(f"num_rows: a prefill of R={R} > capacity={cfg.capacity} rows with "
                       f"num_rows runs on the chunked path, which "
                       + ("chunked=False turns off" if chunked is False else
                          f"this geometry (headdim {cfg.headdim}, dstate {cfg.dstate}) "
                          f"does not take"))
    chunked = True
  chunked = dispatch.use_chunked(cfg, backend, R, chunked, xbc.dtype)
  return dispatch.call(params, state, xbc, dt, jnp.asarray(state_row, jnp.int32), z,
                       cache_indices, num_rows, cfg=cfg, backend=backend, chunked=chunked,
                       chunk_tiles=chunk_tiles if chunked else None,
                       entries_checked=checks.entries_checked(cache_indices))


def _ragged_reference(cfg, params, state, xbc, dt, state_row, z, cache_indices, num_rows):
  """A ragged prefill on the reference backend: one call per distinct length n, each over
  the first n rows with the other sequences as padding (the definition of the op)."""
  if not checks.is_host(num_rows):
    raise ValueError("num_rows: a ragged prefill (R > capacity) on the reference backend "
                     "needs host values (it runs one call per distinct length)")
  B, R, _ = xbc.shape
  ci, _ = status.index_defaults(B, R, cache_indices, None)
  row = jnp.asarray(state_row, jnp.int32)
  _, valid, _ = status.entry_status(cfg, state, row, R, ci, jnp.asarray(num_rows))
  y = jnp.zeros((B, R, cfg.d_inner), xbc.dtype)
  for n in np.unique(num_rows):
    member = jnp.asarray(num_rows == n)
    y_n, state = dispatch.call(params, state, xbc[:, :n], dt[:, :n], row,
                               None if z is None else z[:, :n], jnp.where(member, ci, -1),
                               None, cfg=cfg, backend=config_lib.REFERENCE, chunked=False)
    y_n = jnp.pad(y_n, [(0, 0), (0, R - n), (0, 0)])
    y = jnp.where(member[:, None, None], y_n, y)
  # A rejected sequence's rows are NaN, all R of them (as `verify` gives them).
  return jnp.where(valid[:, None, None] | (ci < 0)[:, None, None], y, jnp.nan), state


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
    (ssm [B, H, P, N] float32 (a 16-bit pool's state widened), conv [B, C, K-1] in the
    state's conv dtype); zeros for padding (entry -1), NaN for a sequence whose
    device-side `state_row` or entry is invalid.

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
  if cache_indices is not None:
    cache_indices = jnp.asarray(cache_indices, jnp.int32)
  return dispatch.committed(params, state, jnp.asarray(state_row, jnp.int32), cache_indices,
                            cfg=cfg, backend=backend)


def convert_state(cfg: Mamba2Config, params: params_lib.LayerParams, state, state_row,
                  to_cfg: Mamba2Config, *, dtype=None, state_dtype=None,
                  backend: str | None = None):
  """Converts a pool between the modes through its committed states (E == B).

  The new pool starts every entry from the committed state at `state_row`; the next call
  uses `state_row = 0`.

  Args:
    cfg, params, state, state_row, backend: as `committed_state`.
    to_cfg: the configuration of the new pool: the same geometry, any mode, capacity and
      window.
    dtype: activation dtype of the calls that follow. Default: a compact pool's window
      dtype, or a snapshot pool's conv dtype (pass it when that conv state is float32 and
      the activations are not).
    state_dtype: storage dtype of the new pool's SSM state (default: the pool's own).

  Returns:
    A `SnapshotState` or `CompactState` (by `to_cfg.replay_mode`) with E entries.

  Raises:
    ValueError: `to_cfg` with another geometry; the errors of `committed_state`.
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
  """[B] bool on the device: the sequences a call of R rows would reject (padding excluded).

  Reasons (`m2v_jax.status`): `state_row` out of range (snapshot: [0, S); compact:
  [0, the last call's pending rows), or exactly 0 with nothing pending), an entry outside the
  pool, `num_rows`
  outside [1, R].
  """
  _, valid, pad = status.entry_status(cfg, state, jnp.asarray(state_row, jnp.int32), R,
                                      cache_indices, num_rows)
  return ~valid & ~pad


def verify_checked(cfg: Mamba2Config, params: params_lib.LayerParams, state, xbc, dt,
                   state_row, **kwargs):
  """`verify` plus a `checkify.Error` that names the first sequence the call rejected.

  Also reports a live `cache_indices` entry that two sequences of the call share (their
  writes would race; host values are rejected before the call, device values only here).

  Returns:
    (y, new_state, err). `err.throw()` raises an error (checkify's) with a message like
    "state_row rejected for sequence 2: state_row=9 ..." if any sequence was invalid (the
    results are still those of `verify`: that sequence untouched, its y NaN). `err.get()`
    returns the message or None without raising. Checking costs a device-to-host read when
    the caller inspects `err`, not before.

  Raises:
    As `verify`.
  """
  bad = invalid_sequences(cfg, state, jnp.asarray(state_row, jnp.int32), xbc.shape[1],
                          cache_indices=kwargs.get("cache_indices"),
                          num_rows=kwargs.get("num_rows"))
  first = jnp.argmax(bad).astype(jnp.int32)
  row = jnp.asarray(state_row, jnp.int32)[first]
  ci, _ = status.index_defaults(bad.shape[0], 0, kwargs.get("cache_indices"), None)
  if cfg.compact:                  # the last call's pending rows
    entry = jnp.clip(ci[first], 0, state.ssm.shape[0] - 1)
    pend = state.pending[entry] - status.last_call_start(state.starts[entry])
  else:
    pend = jnp.int32(cfg.capacity)
  repeated = status.shared_entries(ci)
  dup = jnp.argmax(repeated).astype(jnp.int32)

  def check(b, r, p, d, e):
    checkify.check(b < 0, "state_row rejected for sequence {s}: state_row={r}, allowed "
                   "0 <= state_row < {p} (or exactly 0 with nothing pending), or its "
                   "cache entry / num_rows is out of range", s=b, r=r, p=p)
    checkify.check(d < 0, "cache_indices: sequence {d} addresses pool entry {e}, which "
                   "another sequence of the call addresses too (both rejected)", d=d, e=e)

  err, _ = checkify.checkify(check)(jnp.where(jnp.any(bad), first, -1), row, pend,
                                    jnp.where(jnp.any(repeated), dup, -1), ci[dup])
  y, new_state = verify(cfg, params, state, xbc, dt, state_row, **kwargs)
  return y, new_state, err

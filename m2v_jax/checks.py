"""Host-side argument checks of the public ops: every message a rejected call raises."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from m2v_jax import config as config_lib
from m2v_jax import params as params_lib
from m2v_jax import state as state_lib
from m2v_jax import status
from m2v_jax import tree


def describe(a) -> str:
  """`dtype[shape]` of an array, for messages."""
  return f"{jnp.dtype(a.dtype).name}{list(a.shape)}"


def expect(name, a, shape, dtypes):
  """Raises unless `a` is an array of `shape` and one of `dtypes`."""
  if a is None:
    raise ValueError(f"{name}: expected an array of shape {list(shape)}, got None")
  if not hasattr(a, "shape") or not hasattr(a, "dtype"):
    raise TypeError(f"{name}: expected an array, got {type(a).__name__}")
  if tuple(a.shape) != tuple(shape):
    raise ValueError(f"{name}: expected shape {list(shape)}, got {list(a.shape)}")
  dtypes = [jnp.dtype(d) for d in dtypes]
  if jnp.dtype(a.dtype) not in dtypes:
    hint = (f" (cast it, e.g. {name}.astype(jnp.{dtypes[0].name}))"
            if jnp.dtype(a.dtype) == jnp.float64 else "")
    raise TypeError(f"{name}: expected dtype {' or '.join(d.name for d in dtypes)}, "
                    f"got {jnp.dtype(a.dtype).name}{hint}")


def is_host(a) -> bool:
  """Whether an index argument is a host value (checked here) rather than a device array."""
  return isinstance(a, (int, np.integer, np.ndarray, list, tuple))


def host_int_array(name, a, B):
  """Host integers `a` (a scalar applies to all B) as int32 [B]; TypeError / ValueError naming
  `name` otherwise."""
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


def config(cfg) -> None:
  """Raises TypeError unless `cfg` is a `Mamba2Config`."""
  if not isinstance(cfg, config_lib.Mamba2Config):
    raise TypeError(f"cfg: expected m2v_jax.Mamba2Config, got {type(cfg).__name__}")


def _signature(tree):
  """((shape, dtype), ...) of a NamedTuple of arrays: the key under which a check is cached."""
  return tuple((tuple(a.shape), jnp.dtype(a.dtype)) for a in tree)


def _abstract(kind, signature):
  """`kind` of ShapeDtypeStructs from a `_signature`."""
  return kind(*(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in signature))


def params(cfg: config_lib.Mamba2Config, p) -> None:
  """Raises ValueError/TypeError naming the first parameter whose shape or dtype is wrong."""
  if not isinstance(p, params_lib.LayerParams):
    raise TypeError(f"params: expected m2v_jax.LayerParams, got {type(p).__name__}")
  _checked_params(cfg, _signature(p))


# Checks of shapes and dtypes only, cached per signature (a call's host work stays small); a
# failing check raises, and lru_cache keeps no entry for it.
@functools.lru_cache(maxsize=256)
def _checked_params(cfg, signature) -> None:
  p = _abstract(params_lib.LayerParams, signature)
  for name, shape in zip(params_lib.LayerParams._fields, params_lib.param_shapes(cfg)):
    a = getattr(p, name)
    if tuple(a.shape) != shape:
      raise ValueError(f"params.{name}: expected shape {list(shape)}, got {list(a.shape)}")
    if a.dtype != jnp.float32:
      raise TypeError(f"params.{name}: expected float32, got {a.dtype}")


def backend(cfg: config_lib.Mamba2Config, name: str) -> None:
  """Raises ValueError unless dstate is a power of two (Triton blocks) on the kernel backends."""
  if name != config_lib.REFERENCE and cfg.dstate & (cfg.dstate - 1):
    raise ValueError(f"cfg.dstate: the Pallas kernels need a power of two, got {cfg.dstate} "
                     f"(use backend='reference')")


# The config field behind each axis of a pool leaf (after entries).
_AXES = {
    "SnapshotState": {"ssm": ("capacity", "nheads", "headdim", "dstate"),
                      "conv": ("capacity", "conv_dim", "d_conv - 1")},
    "CompactState": {"ssm": ("nheads", "headdim", "dstate"),
                     "conv": ("conv_dim", "d_conv - 1"),
                     "last_xbc": ("capacity", "conv_dim"),
                     "win_xb": ("window + capacity", "d_inner + ngroups * dstate"),
                     "win_dt": ("window + capacity", "nheads"),
                     "last_bits": ("capacity",)},
}


def _pool_shapes(cfg, st, E, kind):
  """Raises naming the config field a pool leaf's shape disagrees with."""
  want_all = state_lib.state_shapes(cfg, E, jnp.float32)
  for name, axes in _AXES[kind].items():
    got, want = tuple(getattr(st, name).shape), want_all._asdict()[name].shape
    if len(got) != len(want):
      raise ValueError(f"state.{name}: expected shape {list(want)}, got {list(got)}")
    for field, g, w in zip(axes, got[1:], want[1:]):
      if g != w:
        raise ValueError(f"state: the pool was built for another config: state.{name} has "
                         f"{field} = {g} where this cfg has {w} (build the pool with "
                         f"m2v_jax.init_state(cfg, ...) for this cfg)")


def state(cfg: config_lib.Mamba2Config, st, dtype) -> int:
  """Checks a pool against `cfg` and the activation dtype; returns its entries E."""
  expected_type = state_lib.state_type(cfg)
  if not isinstance(st, expected_type):
    raise TypeError(f"state: cfg.replay_mode={cfg.replay_mode!r} expects "
                    f"{expected_type.__name__}, got {type(st).__name__}")
  return _checked_state(cfg, expected_type, _signature(st), jnp.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _checked_state(cfg, kind, signature, dtype) -> int:
  st = _abstract(kind, signature)
  E = st.ssm.shape[0]
  for name in type(st)._fields:
    if getattr(st, name).shape[:1] != (E,):
      raise ValueError(f"state.{name}: expected {E} entries (as state.ssm), got "
                       f"{list(getattr(st, name).shape)}")
  _pool_shapes(cfg, st, E, kind.__name__)
  window_dtype = state_lib.activation_dtype(st)
  if isinstance(st, state_lib.CompactState) and jnp.dtype(window_dtype) != jnp.dtype(dtype):
    raise TypeError(f"xbc: the compact pool keeps {jnp.dtype(window_dtype).name} activations "
                    f"(it was built with that dtype), got {jnp.dtype(dtype).name}: cast xbc "
                    f"and dt, or build the pool with m2v_jax.init_state(cfg, E, "
                    f"jnp.{jnp.dtype(dtype).name})")
  conv_dtypes = (jnp.float32, dtype)
  if jnp.dtype(st.conv.dtype) not in map(jnp.dtype, conv_dtypes):
    raise TypeError(f"state.conv: the pool keeps a {jnp.dtype(st.conv.dtype).name} conv state "
                    f"(it was built for those activations), got {jnp.dtype(dtype).name} "
                    f"activations, which take float32 or their own dtype: cast xbc and dt, or "
                    f"build the pool with m2v_jax.init_state(cfg, E, jnp.{jnp.dtype(dtype).name})")
  shapes = state_lib.state_shapes(cfg, E, dtype, st.conv.dtype)
  for name in type(st)._fields:
    want = getattr(shapes, name)
    dts = {"conv": conv_dtypes, "ssm": state_lib.STATE_DTYPES}.get(name, (want.dtype,))
    expect(f"state.{name}", getattr(st, name), want.shape, dts)
  return E


def call(cfg, p, st, xbc, dt, state_row, z, cache_indices, num_rows, *, verify: bool):
  """Every check of a verify or prefill call.

  Returns (state_row, cache_indices, num_rows), host values as int32 NumPy arrays.
  """
  config(cfg)
  params(cfg, p)
  if not hasattr(xbc, "ndim") or xbc.ndim != 3:
    raise ValueError(f"xbc: expected a [B, R, conv_dim={cfg.conv_dim}] array, got "
                     f"{describe(xbc) if hasattr(xbc, 'shape') else type(xbc).__name__}")
  B, R, _ = xbc.shape
  if R < 1:
    raise ValueError(f"xbc: expected at least one row, got R={R}")
  expect("xbc", xbc, (B, R, cfg.conv_dim), state_lib.ACTIVATION_DTYPES)
  expect("dt", dt, (B, R, cfg.nheads), state_lib.ACTIVATION_DTYPES)
  if z is not None:
    expect("z", z, (B, R, cfg.d_inner), (xbc.dtype,))
  if verify and R > cfg.capacity:
    raise ValueError(f"xbc: a verify call takes at most capacity={cfg.capacity} rows, got R={R} "
                     f"(use m2v_jax.prefill for longer chunks)")
  E = state(cfg, st, xbc.dtype)
  cache_indices = entries(cache_indices, B, E)
  if num_rows is not None:
    if is_host(num_rows):
      nr = host_int_array("num_rows", num_rows, B)
      bad = np.flatnonzero((nr < 1) | (nr > R))
      if bad.size:
        raise ValueError(f"num_rows[{bad[0]}]={nr[bad[0]]}: expected 1 <= num_rows <= R={R}")
      num_rows = nr
    else:
      expect("num_rows", num_rows, (B,), (jnp.int32,))
  state_row = state_rows(cfg, state_row, B, cache_indices)
  return state_row, cache_indices, num_rows


def packed(cfg, p, st, xbc, dt, cu_seqlens, state_row, z, cache_indices):
  """Every check of a packed prefill (xbc [T, C], cu_seqlens [S+1]).

  Returns (cu_seqlens, state_row, cache_indices), host values as int32 NumPy arrays.
  """
  config(cfg)
  params(cfg, p)
  if not hasattr(xbc, "ndim") or xbc.ndim != 2 or xbc.shape[0] < 1:
    raise ValueError(f"xbc: expected a [T, conv_dim={cfg.conv_dim}] array of the prompts' rows "
                     f"back to back, got "
                     f"{describe(xbc) if hasattr(xbc, 'shape') else type(xbc).__name__}")
  T = xbc.shape[0]
  expect("xbc", xbc, (T, cfg.conv_dim), state_lib.ACTIVATION_DTYPES)
  expect("dt", dt, (T, cfg.nheads), state_lib.ACTIVATION_DTYPES)
  if z is not None:
    expect("z", z, (T, cfg.d_inner), (xbc.dtype,))
  if is_host(cu_seqlens):
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.shape[0] < 2:
      raise ValueError(f"cu_seqlens: expected [S+1] offsets (S >= 1 prompts), got shape "
                       f"{list(cu.shape)}")
    cu = host_int_array("cu_seqlens", cu, cu.shape[0])
    if cu[0] != 0:
      raise ValueError(f"cu_seqlens[0]={cu[0]}: expected 0 (the first prompt starts at row 0)")
    short = np.flatnonzero(np.diff(cu) < 1)
    if short.size:
      s = int(short[0])
      raise ValueError(f"cu_seqlens: prompt {s} has {cu[s + 1] - cu[s]} rows (cu_seqlens[{s}]="
                       f"{cu[s]}, cu_seqlens[{s + 1}]={cu[s + 1]}); every prompt needs at least "
                       f"one row")
    if cu[-1] > T:
      raise ValueError(f"cu_seqlens[-1]={cu[-1]}: the prompts end past xbc's T={T} rows")
    cu_seqlens = cu
  else:
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
      raise ValueError(f"cu_seqlens: expected [S+1] offsets (S >= 1 prompts), got "
                       f"{describe(cu_seqlens)}")
    expect("cu_seqlens", cu_seqlens, cu_seqlens.shape, (jnp.int32,))
  S = cu_seqlens.shape[0] - 1
  E = state(cfg, st, xbc.dtype)
  cache_indices = entries(cache_indices, S, E)
  if is_host(state_row) and np.ndim(state_row) == 0:
    state_row = np.full((S,), state_row)
  state_row = state_rows(cfg, state_row, S, cache_indices)
  return cu_seqlens, state_row, cache_indices


def entries(cache_indices, B, E):
  """Checks `cache_indices` [B] (None needs E == B): host values in [-1, E), no live entry twice."""
  if cache_indices is None:
    if E != B:
      raise ValueError(f"cache_indices: required when the pool has {E} entries for a batch of {B}")
    return None
  if not is_host(cache_indices):
    expect("cache_indices", cache_indices, (B,), (jnp.int32,))
    return cache_indices
  ci = host_int_array("cache_indices", cache_indices, B)
  bad = np.flatnonzero((ci < -1) | (ci >= E))
  if bad.size:
    raise ValueError(f"cache_indices[{bad[0]}]={ci[bad[0]]}: expected -1 (padding) or "
                     f"0 <= index < {E}")
  shared = np.flatnonzero(status.shared_entries(ci, xp=np))
  if shared.size:
    e = ci[shared[0]]
    raise ValueError(f"cache_indices: sequences {np.flatnonzero(ci == e).tolist()} all address "
                     f"pool entry {e}; each sequence needs its own entry (-1 for padding)")
  return ci


def entries_checked(cache_indices) -> bool:
  """Whether shared entries were ruled out on the host (None or host values)."""
  return not isinstance(cache_indices, jax.Array)


def state_rows(cfg, state_row, B, cache_indices):
  """Checks `state_row` [B]; host values in [0, capacity) (the pending rule runs on the device)."""
  if not is_host(state_row):
    expect("state_row", state_row, (B,), (jnp.int32,))
    return state_row
  rows = host_int_array("state_row", state_row, B)
  entries = (np.arange(B) if cache_indices is None or not is_host(cache_indices)
             else np.asarray(cache_indices))
  ok = status.row_ok(False, cfg.capacity, rows, None, xp=np)
  bad = np.flatnonzero((entries >= 0) & ~ok)
  if bad.size:
    b = int(bad[0])
    raise ValueError(f"state_row[{b}]={rows[b]}: expected 0 <= state_row < capacity="
                     f"{cfg.capacity}")
  return rows


def parents(parents, B, R):
  """Checks a draft tree's `parents` [B, R]: host values with -1 at row 0 (the root) and
  0 <= parents[b, r] < r after it; a device array needs only its shape and dtype. Either
  way at most `tree.MAX_ROWS` rows."""
  if R > tree.MAX_ROWS:
    raise ValueError(f"parents: a tree call takes at most {tree.MAX_ROWS} rows, got {R}")
  if not is_host(parents):
    expect("parents", parents, (B, R), (jnp.int32,))
    return parents
  arr = np.asarray(parents)
  if not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f"parents: expected integers, got {arr.dtype}")
  if arr.shape != (B, R):
    raise ValueError(f"parents: expected shape [{B}, {R}], got {list(arr.shape)}")
  bad = np.argwhere(~tree.parent_ok(arr, xp=np))
  if bad.size:
    b, t = (int(v) for v in bad[0])
    want = "-1 (row 0 is the root)" if t == 0 else f"a parent row 0 <= parent < {t}"
    raise ValueError(f"parents[{b}, {t}]={arr[b, t]}: expected {want}")
  return arr.astype(np.int32)

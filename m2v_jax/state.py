"""State pools of the two replay modes and their constructors (docs/design.md, "State layouts")."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from m2v_jax import config as config_lib
from m2v_jax import status

ACTIVATION_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
STATE_DTYPES = ACTIVATION_DTYPES          # SSM state storage; the math is float32


class SnapshotState(NamedTuple):
  """Snapshot pool: slot s holds the state after row s (R <= S) or R - S + s of the last call.

  Attributes:
    ssm: [E, S, H, P, N] SSM states, float32 or the 16-bit `state_dtype`.
    conv: [E, S, C, K-1] conv states (raw xBC rows), activation dtype or float32.
  """

  ssm: jax.Array
  conv: jax.Array


class CompactState(NamedTuple):
  """Compact-replay pool: a committed base plus the pending rows of a window.

  Attributes:
    ssm: [E, H, P, N] base SSM state, float32 or the 16-bit `state_dtype`.
    conv: [E, C, K-1] conv state before the last call's first row (activation dtype or float32).
    last_xbc: [E, capacity, C] raw xBC of the last call's rows (activation dtype).
    win_xb: [E, W + capacity, H*P + G*N] post-conv x and B of the pending rows (activation
      dtype), a ring: pending row j is ring row (origin + j) % (W + capacity).
    win_dt: [E, W + capacity, H] float32 processed dt of the pending rows, same ring.
    pending: [E] int32 pending rows (0 ... W).
    starts: [E] int32 bitmask: bit j set when pending row j began a call.
    origin: [E] int32 ring row of pending row 0.
    last_bits: [E, capacity] int32 ancestor bits of the last call's rows: bit k of row t set
      where that call's row k is row t or one of its ancestors (a chain's row t: bits 0..t;
      a draft tree's, its path). A call folds the accepted row's path.
  """

  ssm: jax.Array
  conv: jax.Array
  last_xbc: jax.Array
  win_xb: jax.Array
  win_dt: jax.Array
  pending: jax.Array
  starts: jax.Array
  origin: jax.Array
  last_bits: jax.Array


State = SnapshotState | CompactState


def state_type(cfg: config_lib.Mamba2Config) -> type:
  """The state pytree type of `cfg.replay_mode`."""
  return CompactState if cfg.compact else SnapshotState


def activation_dtype(state: State):
  """The activation dtype a pool implies: the compact window's, else the conv state's."""
  return state.win_xb.dtype if isinstance(state, CompactState) else state.conv.dtype


def _check_dtypes(dtype, conv_dtype, state_dtype=jnp.float32):
  if jnp.dtype(state_dtype) not in STATE_DTYPES:
    raise TypeError(f"state_dtype: expected float32, bfloat16 or float16, got "
                    f"{jnp.dtype(state_dtype)}")
  dtype = jnp.dtype(dtype)
  if dtype not in ACTIVATION_DTYPES:
    raise TypeError(f"dtype: expected one of float32, bfloat16, float16, got {dtype}")
  conv_dtype = dtype if conv_dtype is None else jnp.dtype(conv_dtype)
  if conv_dtype not in (jnp.dtype(jnp.float32), dtype):
    raise TypeError(f"conv_dtype: expected float32 or the activation dtype {dtype}, got {conv_dtype}")
  return dtype, conv_dtype


def state_shapes(cfg: config_lib.Mamba2Config, num_entries: int, dtype=jnp.bfloat16,
                 conv_dtype=None, state_dtype=jnp.float32) -> State:
  """`jax.ShapeDtypeStruct`s of the pool `init_state` would build (no allocation)."""
  dtype, conv_dtype = _check_dtypes(dtype, conv_dtype, state_dtype)
  sdt = jnp.dtype(state_dtype)
  E, H, P, N, C, K1 = (num_entries, cfg.nheads, cfg.headdim, cfg.dstate, cfg.conv_dim,
                       cfg.d_conv - 1)
  sds = jax.ShapeDtypeStruct
  f32 = jnp.float32
  if not cfg.compact:
    S = cfg.capacity
    return SnapshotState(ssm=sds((E, S, H, P, N), sdt), conv=sds((E, S, C, K1), conv_dtype))
  ring, xb = cfg.ring_rows, cfg.d_inner + cfg.ngroups * N
  i32 = jnp.int32
  return CompactState(ssm=sds((E, H, P, N), sdt), conv=sds((E, C, K1), conv_dtype),
                      last_xbc=sds((E, cfg.capacity, C), dtype), win_xb=sds((E, ring, xb), dtype),
                      win_dt=sds((E, ring, H), f32), pending=sds((E,), i32),
                      starts=sds((E,), i32), origin=sds((E,), i32),
                      last_bits=sds((E, cfg.capacity), i32))


def init_state(cfg: config_lib.Mamba2Config, num_entries: int, dtype=jnp.bfloat16,
               conv_dtype=None, state_dtype=jnp.float32) -> State:
  """A zeroed pool of `num_entries` entries for `cfg.replay_mode`; the next `state_row` is 0.

  `dtype`: activation dtype (float32, bfloat16, float16); `conv_dtype`: float32 or `dtype`
  (default); `state_dtype`: SSM storage, float32 (default), bfloat16 or float16 (math stays
  float32; docs/semantics.md). Raises TypeError for an unsupported dtype.
  """
  shapes = state_shapes(cfg, num_entries, dtype, conv_dtype, state_dtype)
  return type(shapes)(*(jnp.zeros(s.shape, s.dtype) for s in shapes))


def reset_state(state: State) -> State:
  """Rewrites the whole pytree with zeros: no slot and no pending row survives."""
  return type(state)(*(jnp.zeros_like(leaf) for leaf in state))


def state_from_committed(cfg: config_lib.Mamba2Config, ssm, conv, dtype=jnp.bfloat16,
                         state_dtype=jnp.float32) -> State:
  """A pool whose entries start from committed states (prefix-cache restore); next `state_row` 0.

  `ssm` [E, H, P, N] float32 (rounded for a 16-bit `state_dtype`), `conv` [E, C, K-1] float32
  or `dtype` (the activation dtype). Fresh buffers. Raises ValueError / TypeError for shapes or
  dtypes that do not match `cfg`.
  """
  ssm = jnp.asarray(ssm)
  conv = jnp.asarray(conv)
  E = ssm.shape[0] if ssm.ndim else 0
  shapes = state_shapes(cfg, E, dtype, conv.dtype, state_dtype)
  base_ssm_shape = (E, cfg.nheads, cfg.headdim, cfg.dstate)
  base_conv_shape = (E, cfg.conv_dim, cfg.d_conv - 1)
  if ssm.shape != base_ssm_shape or ssm.dtype != jnp.float32:
    raise ValueError(f"ssm: expected float32{list(base_ssm_shape)}, got {ssm.dtype}{list(ssm.shape)}")
  if conv.shape != base_conv_shape:
    raise ValueError(f"conv: expected {list(base_conv_shape)}, got {list(conv.shape)}")
  if isinstance(shapes, SnapshotState):
    S = cfg.capacity
    pad = lambda a: jnp.concatenate([a[:, None], jnp.zeros((E, S - 1) + a.shape[1:], a.dtype)], 1)
    return SnapshotState(ssm=pad(ssm.astype(shapes.ssm.dtype)), conv=pad(conv))
  zeros = {f: jnp.zeros(getattr(shapes, f).shape, getattr(shapes, f).dtype)
           for f in CompactState._fields[2:]}
  return CompactState(ssm=jnp.array(ssm, shapes.ssm.dtype, copy=True),
                      conv=jnp.array(conv, copy=True), **zeros)


def state_nbytes(state: State) -> int:
  """Bytes held by a state pool."""
  return int(sum(np.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize for leaf in state))


def reset_entries(state: State, entries, ssm=None, conv=None) -> State:
  """Starts new requests in `entries` [n] int32 (-1 skipped): each is rewritten whole.

  Slot 0 (compact: the base) gets `ssm` [n, H, P, N] float32 and `conv` [n, C, K-1] when given,
  else zeros; the rest is zeroed and the next `state_row` is 0. Jit it with the state donated
  to update in place. Raises ValueError / TypeError for a given state's shape or dtype.
  """
  entries = jnp.asarray(entries, jnp.int32)
  n = entries.shape[0]
  E = state.ssm.shape[0]
  target = jnp.where(status.in_pool(entries, E), entries, E)       # -1 (padding): no entry
  out = []
  for name, leaf in zip(type(state)._fields, state):
    fresh = jnp.zeros((n,) + leaf.shape[1:], leaf.dtype)
    given = {"ssm": ssm, "conv": conv}.get(name)
    if given is not None:
      given = jnp.asarray(given)
      want = (n,) + (leaf.shape[2:] if isinstance(state, SnapshotState) else leaf.shape[1:])
      if given.shape != want:
        raise ValueError(f"{name}: expected shape {list(want)}, got {list(given.shape)}")
      if name == "conv" and given.dtype not in (jnp.dtype(jnp.float32), leaf.dtype):
        raise TypeError(f"conv: expected float32 or {leaf.dtype}, got {given.dtype}")
      given = given.astype(leaf.dtype)
      fresh = fresh.at[:, 0].set(given) if isinstance(state, SnapshotState) else given
    out.append(leaf.at[target].set(fresh, mode="drop"))
  return type(state)(*out)

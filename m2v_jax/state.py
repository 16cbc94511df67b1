"""State pytrees of the two replay modes, and their constructors.

Both states are pools: a leading axis of E entries (one per live request, E >= batch). A call
addresses entries with `cache_indices [B]` (default `arange(B)`, which needs E == B).

The compact window keeps what the SSM kernel consumes: the post-conv x and B of its rows in
the activation dtype and their dt as their call processed it (bias, softplus, its dt_limit),
in a ring of W + capacity rows. The conv state needs raw inputs: the pool keeps the conv
state before the last call's rows and those rows' raw xBC, from which the conv state at any
row of the last call follows.

Memory per entry at Nemotron-3.5-Bolt geometry with bf16 activations and conv state: snapshot
S=8: 8 x (4 MiB + 60 KiB); compact W=8: 4 MiB + 60 KiB + 8 x 20 KiB (raw rows) + 16 x 18.5
KiB (ring) + 12 B. With 16-bit state storage (`state_dtype`) each 4 MiB SSM state takes 2 MiB.

16-bit state storage (`state_dtype` bfloat16 or float16, both modes; default float32): the
math stays float32. A state is rounded to nearest-even where it is stored (a snapshot slot, a
compact base) and widened where it is loaded, and a call's running state is rounded where
the other mode stores it, so that the two modes stay bitwise identical: after every call
segment a compact fold replays (snapshot stored that state in a slot), and, in a call of
R > capacity rows, after row R - capacity - 1 (compact commits it to the base there). float16
holds magnitudes up to 65504 only; bfloat16 has float32's range with 8 bits of mantissa.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from m2v_jax import config as config_lib

ACTIVATION_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Storage dtypes of the SSM state (the `ssm` leaf); the math is float32 in every case.
STATE_DTYPES = ACTIVATION_DTYPES


class SnapshotState(NamedTuple):
  """Snapshot-mode state pool: the states after the last S rows of each entry's last call.

  Slot s of an entry holds the state after row s of its last call (R <= S), or after row
  R - S + s (R > S); the next call starts from slot `state_row`.

  Attributes:
    ssm: [E, S, H, P, N] SSM states, float32 or the 16-bit `state_dtype`.
    conv: [E, S, C, K-1] conv states (the last K-1 raw xBC rows), in the activation dtype or
      float32.
  """

  ssm: jax.Array
  conv: jax.Array


class CompactState(NamedTuple):
  """Compact-replay state pool: slot 0 is the committed base, slot 1 the pending window.

  The next call folds the pending rows up to its `state_row` (a row of the last call) into
  the base, in registers, and keeps its own rows pending. Without deferred commit it writes
  that start state as the new base; with deferred commit (`Mamba2Config.window`) the folded
  rows stay pending, ahead of the call's rows, unless they would not fit (a flush: base
  written, the folded rows dropped).

  Attributes:
    ssm: [E, H, P, N] committed base SSM state, float32 or the 16-bit `state_dtype`.
    conv: [E, C, K-1] conv state before the last call's first row, in the activation dtype
      or float32.
    last_xbc: [E, capacity, C] raw (pre-conv) xBC of the last call's rows, in the activation
      dtype: with `conv`, the conv state at any of them.
    win_xb: [E, W + capacity, H*P + G*N] post-conv x and B of the pending rows, in the
      activation dtype, in a ring: pending row j is ring row `(origin + j) % (W + capacity)`.
    win_dt: [E, W + capacity, H] float32 dt of the pending rows as their call used it (after
      dt_bias, softplus and that call's dt_limit), in the same ring.
    pending: [E] int32 pending rows per entry (0 ... W).
    starts: [E] int32 bitmask: bit j set when pending row j is the first row of a call (bit
      0 whenever rows are pending). The last call's rows start at the highest set bit.
    origin: [E] int32 ring row of pending row 0.
  """

  ssm: jax.Array
  conv: jax.Array
  last_xbc: jax.Array
  win_xb: jax.Array
  win_dt: jax.Array
  pending: jax.Array
  starts: jax.Array
  origin: jax.Array


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
  """`jax.ShapeDtypeStruct`s of the state pool for `cfg.replay_mode` (no allocation); the
  arguments as `init_state`."""
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
                      starts=sds((E,), i32), origin=sds((E,), i32))


def init_state(cfg: config_lib.Mamba2Config, num_entries: int, dtype=jnp.bfloat16,
               conv_dtype=None, state_dtype=jnp.float32) -> State:
  """A zeroed state pool (every entry starts from the zero state; next `state_row` is 0).

  Args:
    cfg: layer geometry; `cfg.replay_mode` picks `SnapshotState` or `CompactState`.
    num_entries: E, entries in the pool.
    dtype: activation dtype of xBC (float32, bfloat16 or float16).
    conv_dtype: dtype of the conv state: float32 or `dtype` (default `dtype`).
    state_dtype: storage dtype of the SSM state: float32 (default), or bfloat16 / float16
      to halve its memory and traffic (the math stays float32; see the module docstring for
      where it rounds).

  Returns:
    A `SnapshotState` or `CompactState` of zeros.

  Raises:
    TypeError: an unsupported dtype.
  """
  shapes = state_shapes(cfg, num_entries, dtype, conv_dtype, state_dtype)
  return type(shapes)(*(jnp.zeros(s.shape, s.dtype) for s in shapes))


def reset_state(state: State) -> State:
  """Rewrites the whole pytree with zeros: no slot and no pending row survives."""
  return type(state)(*(jnp.zeros_like(leaf) for leaf in state))


def state_from_committed(cfg: config_lib.Mamba2Config, ssm, conv, dtype=jnp.bfloat16,
                         state_dtype=jnp.float32) -> State:
  """A state pool whose entries start from given committed states (prefix-cache restore).

  After this the next call uses `state_row = 0` in both modes: snapshot slot 0 holds the
  state (slots 1..S-1 are zero), the compact base holds it with nothing pending. The pool
  owns fresh buffers (ops donate it), so `ssm` and `conv` stay valid.

  Args:
    cfg: layer geometry and mode.
    ssm: [E, H, P, N] float32 committed SSM states (rounded to nearest-even when
      `state_dtype` is 16-bit).
    conv: [E, C, K-1] committed conv states (float32 or `dtype`).
    dtype: activation dtype of the calls that will follow.
    state_dtype: storage dtype of the new pool's SSM state (`init_state`).

  Raises:
    ValueError / TypeError: shapes or dtypes that do not match `cfg`.
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
  """Starts new requests in pool entries: nothing of the previous request survives.

  Each entry is rewritten whole: snapshot slot 0 (compact: the base) holds the given
  committed state, or zeros; every other slot, the window and the pending count are zeroed.
  The next call on these entries uses `state_row = 0`. Jit it with the state donated to
  update the pool in place.

  Args:
    state: either mode's pool [E, ...].
    entries: [n] int32 pool entries to reset (-1 entries are skipped).
    ssm: optional [n, H, P, N] float32 committed states (prefix-cache restore; rounded to
      a 16-bit pool's `state_dtype`).
    conv: optional [n, C, K-1] committed conv states.
  """
  entries = jnp.asarray(entries, jnp.int32)
  n = entries.shape[0]
  E = state.ssm.shape[0]
  target = jnp.where((entries >= 0) & (entries < E), entries, E)    # -1 (padding): no entry
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

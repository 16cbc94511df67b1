"""The verify path of both modes: a static plan and its two launches, conv then SSM."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from m2v_jax import config as config_lib
from m2v_jax import status
from m2v_jax.kernels import dual
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels import verify_conv
from m2v_jax.kernels import verify_ssm

f32 = jnp.float32


class Lead(NamedTuple):
  """A chunked prefill's tail (`Plan.lead`): each of the B sequences' rows from its body's
  end, read from and written into the prefill's flat arrays."""

  xbc: jax.Array          # [T, C] the prefill's flat raw rows
  dt: jax.Array           # [T, H] their raw dt
  z: jax.Array | None     # [T, H*P] their gate, or None
  end: jax.Array          # [B] int32 each body's end row: the tail's first row
  body: jax.Array         # [B] int32 each sequence's body rows
  y: jax.Array            # [T, H*P] the prefill's y, the tail's rows not yet written
  count: jax.Array        # [B] int32 the tail's rows, from row `end`


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one call's launches.

  Attributes:
    cfg: geometry and mode.
    R: new rows; 0 = a compact fold only.
    E, B: pool entries, sequences.
    has_z: whether y is gated.
    y_dtype, conv_dtype, state_dtype: activation, conv state and SSM state dtypes.
    tiles: launch parameters.
    interpret: Pallas interpret mode.
    check_shared: reject the sequences whose pool entry another sequence of the call also
      addresses, in the conv launch (not ruled out on the host).
    tree: the rows form a draft tree (`parents`): each row's conv window and state come
      from its parent's, y sums over its ancestors (R <= capacity).
    lead: a chunked prefill's tail (`Lead`): a sequence with a body starts its conv from
      the window after the body, read from the prefill's flat rows, instead of the
      state's, and y goes into the prefill's flat y.
  """

  cfg: config_lib.Mamba2Config
  R: int
  E: int
  B: int
  has_z: bool
  y_dtype: jnp.dtype
  conv_dtype: jnp.dtype
  tiles: tiles_lib.TileConfig
  interpret: bool
  state_dtype: jnp.dtype = jnp.dtype(jnp.float32)
  check_shared: bool = False
  tree: bool = False
  lead: bool = False

  @property
  def compact(self) -> bool:
    return self.cfg.compact

  @property
  def ordered(self) -> bool:
    """A snapshot tree's rows run child first (`TileConfig.tree_order`, `tree.child_first`)."""
    return self.tree and not self.cfg.compact and bool(self.tiles.tree_order)

  @property
  def walk(self) -> bool:
    """Compact: folds walk the accepted row's path, and calls keep their rows' `last_bits`."""
    return self.cfg.compact and status.walks_paths(self.cfg)

  @property
  def cap(self) -> int:
    return self.cfg.capacity

  @property
  def body(self) -> int:
    """Rows before the kept last `capacity` ones (compact commits them to the base)."""
    return max(self.R - self.cap, 0)

  @property
  def KT(self) -> int:
    return dual.tile_rows(self.cap)

  @property
  def KB(self) -> int:
    """Rows of a body segment: `TileConfig.body_rows` (at most the body rounded up to a power
    of two >= 8, so a short body's one product takes no more rows than it has), else the
    capacity."""
    if not self.tiles.body_rows:
      return self.cap
    return min(self.tiles.body_rows, max(8, tiles_lib.next_pow2(self.body)))

  @property
  def RT(self) -> int:
    """Rows of the post-conv scratch, so every segment tile is in bounds."""
    if not self.body:
      return self.KT
    return max(self.body + self.KT, self.KB)      # KB: a short body's one segment tile

  @property
  def block_c(self) -> int:
    """Conv channels per program, dividing H*P and G*N (no block straddles x, B and C)."""
    cfg = self.cfg
    return tiles_lib.pow2_divisor(math.gcd(cfg.d_inner, cfg.ngroups * cfg.dstate),
                                  self.tiles.block_c)

  @property
  def block_p(self) -> int:
    """P rows per SSM program, dividing P."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def n_cols(self) -> int:
    """Columns per chunk of the SSM program's state, at most N."""
    return min(self.tiles.n_cols, self.cfg.dstate)

  @property
  def exact_rows(self) -> bool:
    """16-bit activations: x, B and C exact in TF32."""
    return self.y_dtype != jnp.dtype(f32)


def run(plan: Plan, params, state, args, parents=None, lead=None):
  """The conv and SSM launches of one call (`status.CallArgs`); returns (y [B, R, H*P], None
  in a fold; new state). With `plan.tree`, `parents` [B, R] int32 gives each row's parent;
  the conv launch rejects a sequence whose parents break `tree.parent_ok`'s rule. With
  `plan.lead`, `lead` is a `Lead`: the call's rows are each sequence's `count` rows from
  row `end` of `lead`'s flat arrays (`args`' xbc, dt and z give only the shapes [B, R, ...]
  and dtypes), a sequence with body rows starts from the last K-1 raw rows before its end
  (the conv state's newest ones where the body is shorter), and the returned y is `lead.y`
  [T, H*P] with those rows written.
  """
  par = jnp.asarray(parents, jnp.int32) if plan.tree else None
  prepped = verify_conv.conv(plan, params, state, args, par, lead)
  out = verify_ssm.ssm(plan, params, state, prepped, args, par, lead)
  if plan.compact:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"],
                      last_xbc=prepped["last_out_ref"], win_xb=prepped["wxb_out_ref"],
                      win_dt=prepped["wdt_out_ref"], pending=out["pend_out_ref"],
                      starts=out["starts_out_ref"], origin=out["origin_out_ref"],
                      last_bits=out.get("lbits_out_ref", state.last_bits))
  else:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"])
  return out.get("y_ref"), new

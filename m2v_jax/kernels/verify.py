"""The verify path of both replay modes: a plan and its two launches (conv, then SSM).

A call of R rows (a verify call, a compact fold with R = 0, the last rows of a prefill, a
short prefill) runs `verify_conv` (conv and dt of the new rows, the window and conv-state
bookkeeping) and then `verify_ssm` (the compact fold, y in the SSD dual form, the states).
The new rows are cut into segments of at most `capacity` rows: a call of R <= capacity rows
is one segment; a longer one has body segments of `capacity` rows from row 0 (the last one
shorter) and then the kept segment, its last `capacity` rows. Both modes run the same
kernels with the same plan but for the mode, so their y and states agree bitwise (one open
exception, docs/semantics.md: 16-bit state with float32 activations).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from m2v_jax import config as config_lib
from m2v_jax.kernels import dual
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels import verify_conv
from m2v_jax.kernels import verify_ssm

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one call's launches.

  Attributes:
    cfg: layer geometry (its `replay_mode` is the mode).
    R: new rows in the call; 0 = fold only (compact: fold the pending rows into the base).
    E: entries in the state pool.
    B: sequences in the call.
    has_z: whether a gate z is applied to y.
    y_dtype: dtype of y (the activation dtype).
    conv_dtype: dtype of the conv state.
    tiles: launch parameters.
    interpret: Pallas interpret mode.
    state_dtype: storage dtype of the SSM state (float32, or 16-bit: `m2v_jax.state`).
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

  @property
  def compact(self) -> bool:
    return self.cfg.compact

  @property
  def cap(self) -> int:
    return self.cfg.capacity

  @property
  def body(self) -> int:
    """Rows before the kept ones: snapshot stores no state of them, compact commits them to
    the base (a call of R > capacity rows keeps its last capacity rows)."""
    return max(self.R - self.cap, 0)

  @property
  def KT(self) -> int:
    """Rows of a segment tile (`dual.tile_rows`)."""
    return dual.tile_rows(self.cap)

  @property
  def RT(self) -> int:
    """Rows of the post-conv scratch: every segment tile, from its first row, in bounds."""
    return self.body + self.KT

  @property
  def block_c(self) -> int:
    """Conv channels per conv program: the tile's block_c, shrunk to divide H*P and G*N, so
    that no block straddles the x, B and C channels."""
    cfg = self.cfg
    return tiles_lib.pow2_divisor(math.gcd(cfg.d_inner, cfg.ngroups * cfg.dstate),
                                  self.tiles.block_c)

  @property
  def block_p(self) -> int:
    """P rows per SSM program: the tile's block_p, shrunk to divide P."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def n_cols(self) -> int:
    """N columns per chunk of the SSM program's state, at most N."""
    return min(self.tiles.n_cols, self.cfg.dstate)

  @property
  def exact_rows(self) -> bool:
    """Whether x, B and C are exact in TF32 (16-bit activations): see `backend.Products`."""
    return self.y_dtype != jnp.dtype(f32)


def run(plan: Plan, params, state, xbc, dt, state_row, z, cache_indices, num_rows):
  """Runs the conv and SSM kernels of one call (`plan.R` = 0: a compact fold).

  Returns (y [B, R, H*P] in the activation dtype, or None for a fold; the new state pytree).
  """
  prepped = verify_conv.conv(plan, params, state, xbc, dt, state_row, cache_indices, num_rows)
  out = verify_ssm.ssm(plan, params, state, prepped, state_row, z, cache_indices, num_rows)
  if plan.compact:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"],
                      last_xbc=prepped["last_out_ref"], win_xb=prepped["wxb_out_ref"],
                      win_dt=prepped["wdt_out_ref"], pending=out["pend_out_ref"],
                      starts=out["starts_out_ref"], origin=out["origin_out_ref"])
  else:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"])
  return out.get("y_ref"), new

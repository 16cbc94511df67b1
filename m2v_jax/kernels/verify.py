"""The verify path of both modes: a static plan and its launches, conv then SSM, or both in one."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from m2v_jax import config as config_lib
from m2v_jax.kernels import backend
from m2v_jax.kernels import dual
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels import verify_conv
from m2v_jax.kernels import verify_ssm

f32 = jnp.float32


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

  @property
  def compact(self) -> bool:
    return self.cfg.compact

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
  def RT(self) -> int:
    """Rows of the post-conv scratch, so every segment tile is in bounds."""
    return self.body + self.KT

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
  def one_launch(self) -> bool:
    """The conv and SSM programs in one launch (`TileConfig.launches`; 0 < R <= capacity)."""
    return self.tiles.launches == 1 and 0 < self.R <= self.cap

  @property
  def exact_rows(self) -> bool:
    """16-bit activations: x, B and C exact in TF32."""
    return self.y_dtype != jnp.dtype(f32)


# SSM refs that name a conv program's output.
_FROM_CONV = dict(fold_ref="fold_ref", prev_starts_ref="prev_starts_ref",
                  prev_origin_ref="prev_origin_ref", xr_ref="xr_ref", dtr_ref="dtr_ref",
                  wxb_ref="wxb_out_ref", wdt_ref="wdt_out_ref")


def _one_kernel(*, cnt_ref, cnt_out_ref, plan, conv_names, ssm_names, **refs):
  """Program t of the one launch, grid (B * (nc + ns),): sequence t // (nc + ns) runs its nc
  conv programs, then its ns SSM programs (P tiles, then heads), which wait for them.

  Refs: those of `verify_conv._conv_kernel` and `verify_ssm._ssm_kernel`, and
    cnt_ref [B] int32 (zeros)       -> cnt_out_ref (aliased): conv programs done, per sequence
  """
  del cnt_ref
  nc, ns = verify_conv.programs(plan), verify_ssm.programs(plan)
  t = pl.program_id(0)
  b, r = t // (nc + ns), t % (nc + ns)

  @pl.when(r < nc)
  def _conv():
    verify_conv._conv_kernel(**{k: refs[k] for k in conv_names}, plan=plan, pids=(r, b))
    backend.arrive(cnt_out_ref, (b,), plan.interpret)

  @pl.when(r >= nc)
  def _ssm():
    u = r - nc
    tiles_per_head = plan.cfg.headdim // plan.block_p
    verify_ssm._ssm_kernel(
        **{k: refs[_FROM_CONV.get(k, k)] for k in ssm_names}, plan=plan,
        pids=(u % tiles_per_head, u // tiles_per_head, b),
        ready=lambda b: backend.wait_count(cnt_out_ref, (b,), nc, plan.interpret))


def _one(plan: Plan, params, state, args):
  """The one launch of `plan` (`Plan.one_launch`); returns its outputs by name."""
  c_in, c_out, c_alias = verify_conv.refs(plan, params, state, args)
  s_in, s_out, s_alias = verify_ssm.refs(plan, params, state, dict.fromkeys(c_out), args)
  s_in = {k: v for k, v in s_in.items() if k not in _FROM_CONV}
  shared = c_in.keys() & s_in.keys()
  assert all(c_in[k] is s_in[k] for k in shared), shared
  names = lambda i, o: [k for k, v in {**i, **o}.items() if v is not None]
  conv_names = names(c_in, c_out)
  ssm_names = names(s_in, s_out) + [k for k in _FROM_CONV if c_out.get(_FROM_CONV[k])]
  return backend.pallas_call(
      lambda **r: _one_kernel(**r, plan=plan, conv_names=conv_names, ssm_names=ssm_names),
      inputs={**c_in, **s_in, "cnt_ref": jnp.zeros((plan.B,), jnp.int32)},
      outputs={**c_out, **s_out,
               "cnt_out_ref": jax.ShapeDtypeStruct((plan.B,), jnp.int32)},
      aliases={**c_alias, **s_alias, "cnt_ref": "cnt_out_ref"},
      grid=(plan.B * (verify_conv.programs(plan) + verify_ssm.programs(plan)),),
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages,
      interpret=plan.interpret, name=f"m2v_verify_{plan.cfg.replay_mode}_r{plan.R}")


def run(plan: Plan, params, state, args):
  """The launches of one call (`status.CallArgs`); returns (y [B, R, H*P], None in a fold;
  new state)."""
  if plan.one_launch:
    prepped = out = _one(plan, params, state, args)
  else:
    prepped = verify_conv.conv(plan, params, state, args)
    out = verify_ssm.ssm(plan, params, state, prepped, args)
  if plan.compact:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"],
                      last_xbc=prepped["last_out_ref"], win_xb=prepped["wxb_out_ref"],
                      win_dt=prepped["wdt_out_ref"], pending=out["pend_out_ref"],
                      starts=out["starts_out_ref"], origin=out["origin_out_ref"])
  else:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"])
  return out.get("y_ref"), new

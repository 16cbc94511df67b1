"""The Mamba-2 mixer layer: in_proj, the conv + SSM ops, gated RMSNorm, out_proj.

As Hugging Face's `Mamba2Mixer` and Nemotron-H's Mamba layers (`norm_before_gate=False`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from m2v_jax import config as config_lib
from m2v_jax import ops
from m2v_jax import params as params_lib
from m2v_jax.kernels import rowmath

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class MixerConfig:
  """A mixer layer: the SSM's `Mamba2Config` plus the projections and the norm.

  Attributes:
    ssm: the conv + SSM `Mamba2Config`.
    d_model: width of the layer's input and output.
    norm_eps: epsilon of the gated RMSNorm.
    norm_groups: groups of the gated RMSNorm (default `ssm.ngroups`).
    decode_dt_limit: dt clamp of a one-row verify call, if it differs from `ssm.dt_limit`
      (transformers clamps dt in its multi-token path only; `m2v_jax.hf` sets (0, inf)).
  """

  ssm: config_lib.Mamba2Config
  d_model: int
  norm_eps: float = 1e-5
  norm_groups: int | None = None
  decode_dt_limit: tuple[float, float] | None = None

  def __post_init__(self):
    if not isinstance(self.d_model, int) or self.d_model < 1:
      raise ValueError(f"d_model: expected a positive int, got {self.d_model!r}")
    if self.d_inner % self.groups:
      raise ValueError(f"norm_groups: expected a divisor of d_inner={self.d_inner}, got "
                       f"{self.groups}")

  @property
  def d_inner(self) -> int:
    return self.ssm.d_inner

  @property
  def groups(self) -> int:
    return self.ssm.ngroups if self.norm_groups is None else self.norm_groups

  @property
  def d_in_proj(self) -> int:
    """Width of in_proj's output: z (d_inner), xBC (conv_dim), dt (nheads)."""
    return self.d_inner + self.ssm.conv_dim + self.ssm.nheads


class MixerParams(NamedTuple):
  """Parameters of one mixer layer.

  Attributes:
    in_proj: [d_model, d_in_proj] (the transpose of Hugging Face's), any float dtype.
    ssm: `LayerParams` (float32).
    norm_weight: [d_inner].
    out_proj: [d_inner, d_model].
  """

  in_proj: jax.Array
  ssm: params_lib.LayerParams
  norm_weight: jax.Array
  out_proj: jax.Array


def random_mixer_params(cfg: MixerConfig, key=0, weight_dtype=jnp.float32,
                        out_scale: float = 1.0) -> MixerParams:
  """Random mixer parameters for tests and benchmarks (`key`: a `jax.random` key or int seed)."""
  k = jax.random.split(params_lib.as_key(key), 4)
  w = lambda i, shape, std: (std * jax.random.normal(k[i], shape, jnp.float32)).astype(weight_dtype)
  return MixerParams(in_proj=w(0, (cfg.d_model, cfg.d_in_proj), cfg.d_model ** -0.5),
                     ssm=params_lib.random_params(cfg.ssm, k[1]),
                     norm_weight=w(2, (cfg.d_inner,), 0.1) + jnp.asarray(1, weight_dtype),
                     out_proj=w(3, (cfg.d_inner, cfg.d_model), out_scale * cfg.d_inner ** -0.5))


def check_params(cfg: MixerConfig, p: MixerParams) -> None:
  """Raises ValueError naming the first parameter whose shape does not match `cfg`."""
  want = dict(in_proj=(cfg.d_model, cfg.d_in_proj), norm_weight=(cfg.d_inner,),
              out_proj=(cfg.d_inner, cfg.d_model))
  for name, shape in want.items():
    got = tuple(getattr(p, name).shape)
    if got != shape:
      raise ValueError(f"{name}: expected shape {list(shape)}, got {list(got)}")


def split_projection(cfg: MixerConfig, zxbcdt):
  """[..., d_in_proj] -> (z [..., d_inner], xBC [..., conv_dim], dt [..., nheads])."""
  di, C = cfg.d_inner, cfg.ssm.conv_dim
  return zxbcdt[..., :di], zxbcdt[..., di:di + C], zxbcdt[..., di + C:]


def gated_rms_norm(y, z, weight, groups: int, eps: float):
  """RMSNorm(y * silu(z)) over `groups` channel groups, times `weight`; float32."""
  g = y.astype(f32) * rowmath.silu(z.astype(f32))
  shape = g.shape
  g = g.reshape(shape[:-1] + (groups, shape[-1] // groups))
  g = g * lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + eps)
  return g.reshape(shape) * weight.astype(f32)


def project(a, w, dtype=f32):
  """a @ w in `dtype`; a 16-bit weight takes `a` rounded to its dtype, and the product of two
  16-bit operands is rounded to a 16-bit `dtype` in the GEMM (float32 products otherwise)."""
  if jnp.dtype(w.dtype).itemsize == 2:
    out = dtype if jnp.dtype(dtype) == jnp.dtype(w.dtype) else f32
    return jnp.dot(a.astype(w.dtype), w, preferred_element_type=out).astype(dtype)
  return jnp.dot(a, w, precision=lax.Precision.HIGHEST, preferred_element_type=f32).astype(dtype)


def mixer(cfg: MixerConfig, params: MixerParams, state, hidden, state_row, *,
          cache_indices=None, num_rows=None, prefill: bool = False, chunked=None,
          cu_seqlens=None, parents=None, backend: str | None = None):
  """One mixer layer over R rows of each sequence, or over prompts packed back to back.

  Args:
    cfg, params: `MixerConfig`, `MixerParams`.
    state: the pool (`init_state(cfg.ssm, ...)`); donated when run eagerly.
    hidden: [B, R, d_model], float32, bfloat16 or float16 (the activation dtype); [T, d_model]
      with `cu_seqlens`.
    state_row, cache_indices, num_rows, parents, backend: as `m2v_jax.verify` (`parents`: a
      draft tree, verify calls only).
    prefill, chunked: run `m2v_jax.prefill` (any R, ragged with num_rows) instead of verify.
    cu_seqlens: [S+1] int32: run `m2v_jax.prefill_packed` on the prompts at these offsets.

  Returns:
    (out [B, R, d_model] or [T, d_model] in hidden's dtype, new state); NaN rows if rejected,
    0 if padding.

  Raises:
    ValueError / TypeError: as the ops, and parameter shapes that do not match `cfg`.
  """
  check_params(cfg, params)
  return mixer_partial(cfg, params, state, hidden, state_row, cache_indices=cache_indices,
                       num_rows=num_rows, prefill=prefill, chunked=chunked,
                       cu_seqlens=cu_seqlens, parents=parents, backend=backend,
                       out_dtype=hidden.dtype)


def mixer_partial(cfg: MixerConfig, params: MixerParams, state, hidden, state_row, *,
                  cache_indices=None, num_rows=None, prefill: bool = False, chunked=None,
                  cu_seqlens=None, parents=None, backend: str | None = None, out_dtype=f32):
  """`mixer` with out_proj's product in `out_dtype` (float32: a head shard's partial sum);
  params unchecked."""
  if parents is not None and (prefill or cu_seqlens is not None):
    raise ValueError("parents: a draft tree is a verify call; prefill takes none")
  dtype = hidden.dtype
  z, xbc, dt = split_projection(cfg, project(hidden, params.in_proj, dtype))
  if cu_seqlens is not None:
    if num_rows is not None or chunked is False:
      raise ValueError("cu_seqlens: a packed prefill takes no num_rows and always runs the "
                       "chunked path")
    y, state = ops.prefill_packed(cfg.ssm, params.ssm, state, xbc, dt, cu_seqlens,
                                  state_row=state_row, cache_indices=cache_indices,
                                  backend=backend)
  elif prefill:
    y, state = ops.prefill(cfg.ssm, params.ssm, state, xbc, dt, state_row,
                           cache_indices=cache_indices, num_rows=num_rows, chunked=chunked,
                           backend=backend)
  else:
    ssm = cfg.ssm
    if hidden.shape[1] == 1 and cfg.decode_dt_limit is not None:
      ssm = ssm.replace(dt_limit=cfg.decode_dt_limit)
    y, state = ops.verify(ssm, params.ssm, state, xbc, dt, state_row,
                          cache_indices=cache_indices, num_rows=num_rows, parents=parents,
                          backend=backend)
  g = gated_rms_norm(y, z, params.norm_weight, cfg.groups, cfg.norm_eps)
  return project(g, params.out_proj, out_dtype), state


def state_row_from_accepted(num_accepted_tokens):
  """`state_row` from vLLM / FlashInfer's `num_accepted_tokens` [B] (>= 1): that minus 1.

  k accepted drafts give k + 1 tokens, and the next call starts from the state after row k.
  Returns [B] int32, on the host or the device as given.
  """
  if isinstance(num_accepted_tokens, jax.Array):
    return (num_accepted_tokens - 1).astype(jnp.int32)
  return (np.asarray(num_accepted_tokens) - 1).astype(np.int32)

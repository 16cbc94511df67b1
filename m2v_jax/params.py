"""Per-layer parameters the verify ops read (the Mamba-2 mixer's conv and SSM parameters)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from m2v_jax import config as config_lib


class LayerParams(NamedTuple):
  """Conv and SSM parameters of one Mamba-2 mixer, all float32.

  Attributes:
    conv_weight: [C, K] depthwise causal-conv taps, oldest input first (state-spaces/mamba's
      `conv1d.weight[:, 0, :]`).
    conv_bias: [C] conv bias.
    dt_bias: [H] added to dt before the softplus.
    A_log: [H]; A = -exp(A_log) per head.
    D: [H] skip connection per head.
  """

  conv_weight: jax.Array
  conv_bias: jax.Array
  dt_bias: jax.Array
  A_log: jax.Array
  D: jax.Array


def param_shapes(cfg: config_lib.Mamba2Config) -> LayerParams:
  """The expected shapes of `LayerParams` for `cfg`."""
  C, K, H = cfg.conv_dim, cfg.d_conv, cfg.nheads
  return LayerParams(conv_weight=(C, K), conv_bias=(C,), dt_bias=(H,), A_log=(H,), D=(H,))


def random_params(cfg: config_lib.Mamba2Config, seed: int = 0) -> LayerParams:
  """Random parameters in the ranges trained Mamba-2 layers have (for tests and benchmarks).

  dt_bias is drawn so that softplus(dt_bias) lies in [1e-3, 1e-1] (the Mamba-2 dt init),
  A_log = log(U[1, 16]), D ~ U[0.5, 1.5], conv taps ~ N(0, 1/K).
  """
  rng = np.random.default_rng(seed)
  C, K, H = cfg.conv_dim, cfg.d_conv, cfg.nheads
  dt0 = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H))
  return LayerParams(
      conv_weight=jnp.asarray(rng.normal(0, 1 / np.sqrt(K), (C, K)), jnp.float32),
      conv_bias=jnp.asarray(rng.normal(0, 0.1, C), jnp.float32),
      dt_bias=jnp.asarray(dt0 + np.log(-np.expm1(-dt0)), jnp.float32),
      A_log=jnp.asarray(np.log(rng.uniform(1, 16, H)), jnp.float32),
      D=jnp.asarray(rng.uniform(0.5, 1.5, H), jnp.float32),
  )

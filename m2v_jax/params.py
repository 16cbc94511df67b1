"""Per-layer conv and SSM parameters of the Mamba-2 mixer."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from m2v_jax import config as config_lib


class LayerParams(NamedTuple):
  """Conv and SSM parameters of one Mamba-2 mixer, all float32.

  Attributes:
    conv_weight: [C, K] causal-conv taps, oldest first (mamba's `conv1d.weight[:, 0, :]`).
    conv_bias: [C].
    dt_bias: [H], added to dt before the softplus.
    A_log: [H]; A = -exp(A_log).
    D: [H] skip connection.
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


def random_params(cfg: config_lib.Mamba2Config, key=0) -> LayerParams:
  """Random parameters in the ranges of trained Mamba-2 layers (tests, benchmarks); float32.

  softplus(dt_bias) in [1e-3, 1e-1], A_log = log(U[1, 16]), D ~ U[0.5, 1.5], taps ~ N(0, 1/K),
  conv bias ~ N(0, 0.1²). `key`: a `jax.random` key or an int seed.
  """
  C, K, H = cfg.conv_dim, cfg.d_conv, cfg.nheads
  k = jax.random.split(as_key(key), 5)
  u = lambda i, n, lo, hi: jax.random.uniform(k[i], (n,), jnp.float32, lo, hi)
  dt0 = jnp.exp(u(0, H, np.log(1e-3), np.log(1e-1)))
  return LayerParams(
      conv_weight=jax.random.normal(k[1], (C, K), jnp.float32) / np.sqrt(K),
      conv_bias=0.1 * jax.random.normal(k[2], (C,), jnp.float32),
      dt_bias=dt0 + jnp.log(-jnp.expm1(-dt0)),
      A_log=jnp.log(u(3, H, 1.0, 16.0)),
      D=u(4, H, 0.5, 1.5),
  )


def as_key(key):
  """`key` as a `jax.random` key: an int seeds one, a key passes through."""
  if isinstance(key, (int, np.integer)):
    return jax.random.key(int(key))
  return key

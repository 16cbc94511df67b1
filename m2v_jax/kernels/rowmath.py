"""The math of one Mamba-2 row (docs/semantics.md, "One row"), shared by kernels and reference.

Plain jax.numpy on values (register tiles in a kernel); every product and sum rounds on its
own, except the multiply-add `state_update` passes to `fma`. Math: Dao & Gu, "Transformers are
SSMs" (2024), and state-spaces/mamba's `Mamba2.step`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

SOFTPLUS_THRESHOLD = 20.0


def silu(v):
  """silu(v) = v / (1 + exp(-v)), float32."""
  return v / (1.0 + jnp.exp(-v))


def round_to(v, dtype, triton: bool = False):
  """float32 `v` rounded to `dtype`'s precision, kept float32: `lax.reduce_precision` under XLA
  (which may drop a round trip as excess precision), the round trip in a Triton kernel.
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return v
  if triton:
    return v.astype(dtype).astype(jnp.float32)
  info = jnp.finfo(dtype)
  return lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def stored(v, dtype, triton: bool = False):
  """float32 `v` as a store in `dtype` and a load give it, kept float32 (unlike `reduce_precision`,
  float16 subnormals survive); an optimization barrier keeps XLA from dropping the round trip.
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return v
  low = v.astype(dtype)
  if not triton:
    low = lax.optimization_barrier(low)
  return low.astype(jnp.float32)


def conv_output(weights, window, bias, dtype, triton: bool = False, act=silu):
  """One causal-conv output, silu(sum_k w_k * win_k + bias) summed left to right, in `dtype`.

  `weights`: K float32 taps, oldest first; `window`: the K-1 conv-state columns, then the new
  input, as values or as functions that load them (called in tap order, so a kernel holds one
  tap at a time); `triton`: inside a compiled Triton kernel (see `round_to`); `act`: the silu.
  """
  tap = lambda v: v() if callable(v) else v
  acc = weights[0] * tap(window[0])
  for w, v in zip(weights[1:], window[1:]):
    acc = acc + w * tap(v)
  return round_to(act(acc + bias), dtype, triton)


def process_dt(dt_raw, dt_bias, dt_limit):
  """dt + dt_bias, softplus (threshold 20), then the static `dt_limit` (lo, hi) clamp; float32."""
  dt = dt_raw + dt_bias
  # The minimum keeps the unselected branch's exp finite, so gradients stay finite.
  dt = jnp.where(dt <= SOFTPLUS_THRESHOLD,
                 jnp.log1p(jnp.exp(jnp.minimum(dt, SOFTPLUS_THRESHOLD))), dt)
  lo, hi = dt_limit
  if lo > 0.0:
    dt = jnp.maximum(dt, lo)
  if hi != float("inf"):
    dt = jnp.minimum(dt, hi)
  return dt


def decay(dt, a_log):
  """dA = exp(dt * A) with A = -exp(A_log), float32."""
  return jnp.exp(dt * -jnp.exp(a_log))


def unfused(a, b, c):
  """a * b + c, the product rounded on its own."""
  return a * b + c


def state_update(st, dA, dtx, b, fma=unfused):
  """st * dA + dtx * b, one row of the recurrence: st [..., P, N], dtx [..., P, 1], b [..., 1, N].

  `fma` rounds `st * dA + (dtx * b)`: `unfused`, or `kernels.backend.fma` compiled.
  """
  return fma(st, dA, dtx * b)


def readout(st, c, d, x):
  """y = sum_n st * c + D * x (no gate): st [..., P, N], x [..., P]; float32."""
  return jnp.sum(st * c, axis=-1) + d * x


def gate(y, z):
  """y * silu(z)."""
  return y * silu(z)

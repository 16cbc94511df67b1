"""The per-row math of one Mamba-2 mixer step (docs/semantics.md, "One row"), written once.

The conv and the dt processing here are what every kernel and the jax.numpy reference run;
`state_update` and `readout` are the serial recurrence of the oracle (`reference.rows`),
which the kernels' SSD dual form (`kernels.dual`) matches to float32 rounding. They are plain
`jax.numpy` expressions on values: inside a Pallas kernel they see register tiles, in the
reference whole arrays; the caller brings the operands to broadcastable shapes. Every product
and every sum is rounded to float32 on its own, in the order written here, except the
multiply-add that `state_update` routes through its `fma` argument (the compiled kernels pass
one fused multiply-add, `kernels.backend.fma`): the Pallas Triton lowering contracts nothing
by itself, and the test suite runs XLA:CPU with `--xla_cpu_max_isa=AVX`, which keeps it from
contracting too.

Source of the math: Dao & Gu, "Transformers are SSMs" (Mamba-2, 2024), the selective SSM
recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t, and the
`Mamba2.step` conv of state-spaces/mamba.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

SOFTPLUS_THRESHOLD = 20.0


def silu(v):
  """silu(v) = v / (1 + exp(-v)), float32."""
  return v / (1.0 + jnp.exp(-v))


def round_to(v, dtype, triton: bool = False):
  """float32 `v` rounded to the precision of `dtype` (to nearest even), kept in float32.

  `lax.reduce_precision` under XLA, which keeps it where it may drop a float32 -> bfloat16 ->
  float32 round trip as excess precision (XLA:GPU does); inside a compiled Triton kernel
  (`triton=True`), which has no rule for it and keeps every conversion, the round trip.
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return v
  if triton:
    return v.astype(dtype).astype(jnp.float32)
  info = jnp.finfo(dtype)
  return lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def stored(v, dtype, triton: bool = False):
  """float32 `v` as storing it in `dtype` and loading it back gives it (round to nearest-even,
  subnormals and overflow as the conversion gives them), kept in float32.

  Unlike `round_to`'s `reduce_precision` (which flushes what would be a float16 subnormal to
  zero), this is the conversion itself: under XLA an optimization barrier keeps the round
  trip from being dropped as excess precision; inside a compiled Triton kernel every
  conversion is kept anyway.
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return v
  low = v.astype(dtype)
  if not triton:
    low = lax.optimization_barrier(low)
  return low.astype(jnp.float32)


def conv_output(weights, window, bias, dtype, triton: bool = False):
  """One causal-conv output column: silu(sum_k w_k * win_k + bias), rounded to `dtype`.

  Args:
    weights: K float32 arrays (the conv taps, oldest first), each broadcastable to the window.
    window: K float32 arrays: the K-1 conv-state columns (oldest first), then the new input.
    bias: float32 conv bias.
    dtype: the activation dtype: the output is rounded to it (`round_to`), as the causal conv
      of every Mamba-2 implementation returns its output in the activation dtype; a no-op
      for float32.
    triton: whether this runs inside a compiled Triton kernel (see `round_to`).

  Returns:
    The post-conv activation as float32 (holding a `dtype` value). The sum runs left to right
    over k, then adds the bias; silu is computed in float32.
  """
  acc = weights[0] * window[0]
  for w, v in zip(weights[1:], window[1:]):
    acc = acc + w * v
  return round_to(silu(acc + bias), dtype, triton)


def process_dt(dt_raw, dt_bias, dt_limit):
  """dt after the bias, softplus (threshold 20) and the dt_limit clamp, float32.

  Args:
    dt_raw: float32 dt before the bias.
    dt_bias: float32 per-head bias, broadcastable to `dt_raw`.
    dt_limit: static (lo, hi). Softplus output is >= 0, so the default (0, inf) is a no-op
      and is skipped.
  """
  dt = dt_raw + dt_bias
  # The minimum leaves every selected value unchanged; it keeps exp finite in the branch that
  # is not selected, so gradients (training through the reference) stay finite.
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
  """a * b + c with the product rounded on its own (what JAX computes for `a * b + c`)."""
  return a * b + c


def state_update(st, dA, dtx, b, fma=unfused):
  """st * dA + dtx * b: one row of the SSM recurrence (the outer product dtx ⊗ b).

  Args:
    st: state, float32, with a P axis and an N axis.
    dA: decay, broadcastable to `st` (a scalar per head).
    dtx: dt * x, broadcast along the N axis of `st` (e.g. [..., P, 1]).
    b: B row of the head's group, broadcast along the P axis (e.g. [..., 1, N]).
    fma: how `st * dA + (dtx * b)` is rounded: `unfused`, or the compiled kernels' fused
      multiply-add (`kernels.backend.fma`).
  """
  return fma(st, dA, dtx * b)


def readout(st, c, d, x):
  """y = sum_n st[..., n] * c[..., n] + D * x, float32 (no gate): st [..., P, N], c
  broadcastable to it, d broadcastable to x [..., P]."""
  return jnp.sum(st * c, axis=-1) + d * x


def gate(y, z):
  """y * silu(z) (the optional in-kernel gate)."""
  return y * silu(z)

"""The per-row math of one Mamba-2 mixer step (SPEC §2), written once.

Every kernel (snapshot, compact replay, serial prefill tail) and the jax.numpy reference call
these functions, so the operation order -- and with it the rounding -- is the same everywhere.
They are plain `jax.numpy` expressions on values: inside a Pallas kernel they see register
tiles, in the reference whole arrays; the caller brings the operands to broadcastable shapes.

Rounding policy (BUILD.md, "Rounding policy"): no fused multiply-add. Every product and every
sum is rounded to float32 on its own, in the order written here. On the GPU the Pallas Triton
lowering emits `mul.rn.f32` / `add.rn.f32` for these expressions (no contraction; pinned by
`tests/test_gpu.py::test_rounding_policy_canary`). XLA:CPU contracts `a*b+c` into an FMA
unless `--xla_cpu_max_isa=AVX` is set, which the test suite sets.

Source of the math: Dao & Gu, "Transformers are SSMs" (Mamba-2, 2024), the selective SSM
recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t, and the
`Mamba2.step` conv of state-spaces/mamba.
"""

from __future__ import annotations

import jax.numpy as jnp

SOFTPLUS_THRESHOLD = 20.0


def silu(v):
  """silu(v) = v / (1 + exp(-v)), float32."""
  return v / (1.0 + jnp.exp(-v))


def conv_output(weights, window, bias):
  """One causal-conv output column: silu(sum_k w_k * win_k + bias).

  Args:
    weights: K float32 arrays (the conv taps, oldest first), each broadcastable to the window.
    window: K float32 arrays: the K-1 conv-state columns (oldest first), then the new input.
    bias: float32 conv bias.

  Returns:
    The post-conv activation, float32. The sum runs left to right over k, then adds the bias.
  """
  acc = weights[0] * window[0]
  for w, v in zip(weights[1:], window[1:]):
    acc = acc + w * v
  return silu(acc + bias)


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


def state_update(st, dA, dtx, b):
  """st * dA + dtx ⊗ b: the SSM state update, no FMA.

  Args:
    st: state [..., P, N] float32.
    dA: decay, broadcastable to `st` (a scalar per head).
    dtx: dt * x, [..., P].
    b: B row of the head's group, [..., N].
  """
  return st * dA + dtx[..., :, None] * b[..., None, :]


def readout(st, c, d, x):
  """y = sum_n st[..., n] * c[n] + D * x, float32 (no gate).

  Args:
    st: state [..., P, N].
    c: C row of the head's group, [..., N].
    d: D of the head, broadcastable to x.
    x: x of the head, [..., P].
  """
  return jnp.sum(st * c[..., None, :], axis=-1) + d * x


def gate(y, z):
  """y * silu(z) (the optional in-kernel gate)."""
  return y * silu(z)

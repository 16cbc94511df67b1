"""The causal conv of a chunked prefill's body, as one Pallas kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels.chunk_scan import ChunkPlan

f32 = jnp.float32


def _conv_kernel(*, xbc_ref, head_ref, rb_ref, w_ref, bias_ref, post_ref, plan: ChunkPlan):
  """Body conv, grid (Rp / conv_rows, C / conv_cols, B).

  Refs:
    xbc_ref   [B, R, C]        raw rows (the body is rows 0..Rb-1)
    head_ref  [B, K-1, C]      conv state before the body, oldest first
    rb_ref    [B] int32        body rows of each sequence
    w_ref     [C, K] f32, bias_ref [C] f32
    post_ref  [B, Rp, C]       post-conv rows in the activation dtype, zero from rb on
  """
  cfg = plan.cfg
  K, BR, BC, Rb = cfg.d_conv, plan.conv_rows, plan.conv_cols, plan.Rb
  i, j, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  r = i * BR + lax.broadcasted_iota(jnp.int32, (BR,), 0)
  cols = pl.ds(j * BC, BC)
  taps = [w_ref[cols, k].astype(f32)[None, :] for k in range(K)]
  bias = bias_ref[cols].astype(f32)[None, :]

  def conv(first: bool):
    window = []
    for k in range(K):
      src = r - (K - 1) + k                                      # body row of tap k
      v = xbc_ref[b, jnp.clip(src, 0, Rb - 1), cols].astype(f32)           # [BR, BC]
      if first:                                                  # rows before the body
        hv = head_ref[b, jnp.clip(src + K - 1, 0, K - 2), cols].astype(f32)
        v = jnp.where((src >= 0)[:, None], v, hv)
      window.append(v)
    out = rowmath.conv_output(taps, window, bias, plan.y_dtype, not plan.interpret)
    post_ref[b, pl.ds(i * BR, BR), cols] = jnp.where((r < rb_ref[b])[:, None], out,
                                                     0.0).astype(post_ref.dtype)

  # Only the first block reaches before the body (conv_rows >= K-1 by the plan).
  pl.when(i == 0)(lambda: conv(True))
  pl.when(i > 0)(lambda: conv(False))


def body_conv(plan: ChunkPlan, xbc, conv0, rb, conv_weight, conv_bias):
  """Post-conv body rows [B, Rp, C] (xbc's dtype) from xbc [B, R, C] and conv0 [B, C, K-1]."""
  cfg = plan.cfg
  C = cfg.conv_dim
  head = jnp.swapaxes(conv0, 1, 2)                               # [B, K-1, C]
  out = backend.pallas_call(
      lambda **refs: _conv_kernel(**refs, plan=plan),
      inputs=dict(xbc_ref=xbc, head_ref=head, rb_ref=rb, w_ref=conv_weight,
                  bias_ref=conv_bias),
      outputs=dict(post_ref=jax.ShapeDtypeStruct((plan.B, plan.Rp, C), plan.y_dtype)),
      grid=(plan.Rp // plan.conv_rows, C // plan.conv_cols, plan.B),
      num_warps=plan.tiles.conv_warps, num_stages=1, interpret=plan.interpret,
      name=f"m2v_chunk_conv_{cfg.replay_mode}")
  return out["post_ref"]

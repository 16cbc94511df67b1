"""The causal conv of a chunked prefill's bodies: all rows, then each sequence's first K-1."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels.chunk_scan import ChunkPlan

f32 = jnp.float32


def _output(plan, w_ref, bias_ref, cols, window):
  """Post-conv rows [rows, BC] from `window(k)`, the rows' tap k as float32."""
  K = plan.cfg.d_conv
  taps = [w_ref[cols, k].astype(f32)[None, :] for k in range(K)]
  bias = bias_ref[cols].astype(f32)[None, :]
  return rowmath.conv_output(taps, [lambda k=k: window(k) for k in range(K)], bias,
                             plan.y_dtype, not plan.interpret)


def _conv_kernel(*, xbc_ref, live_ref, w_ref, bias_ref, post_ref, plan: ChunkPlan):
  """Body conv, grid (conv_T / conv_rows, C / conv_cols); taps from the previous rows of xbc
  (`_head_kernel` then rewrites each sequence's first K-1 rows); a block without a body row
  stores zeros.

  Refs:
    xbc_ref   [T, C]           raw rows, sequences back to back
    live_ref  [conv_T] int32   1 for a body row
    w_ref     [C, K] f32, bias_ref [C] f32
    post_ref  [conv_T, C]      post-conv body rows in the activation dtype, zero elsewhere
  """
  K, BR, BC, T = plan.cfg.d_conv, plan.conv_rows, plan.conv_cols, plan.T
  i, j = pl.program_id(0), pl.program_id(1)
  rows, cols = pl.ds(i * BR, BR), pl.ds(j * BC, BC)
  r = i * BR + lax.broadcasted_iota(jnp.int32, (BR,), 0)
  live = live_ref[rows] > 0
  any_live = jnp.max(live.astype(jnp.int32)) > 0

  @pl.when(any_live)
  def _conv():
    out = _output(plan, w_ref, bias_ref, cols, lambda k: xbc_ref[
        jnp.clip(r - (K - 1) + k, 0, T - 1), cols].astype(f32))
    post_ref[rows, cols] = jnp.where(live[:, None], out, 0.0).astype(post_ref.dtype)

  @pl.when(jnp.logical_not(any_live))
  def _zeros():
    post_ref[rows, cols] = jnp.zeros((BR, BC), post_ref.dtype)


def _head_kernel(*, xbc_ref, base_ref, rb_ref, head_ref, w_ref, bias_ref, post_ref,
                 post_out_ref, plan: ChunkPlan):
  """The first K-1 rows of each body, their earlier taps from the sequence's conv state,
  grid (S, C / conv_cols).

    base_ref, rb_ref [S] int32; head_ref [S, K-1, C]: conv state before each sequence, oldest
    first; post_ref: `_conv_kernel`'s rows, aliased to post_out_ref.
  """
  K, BC, T = plan.cfg.d_conv, plan.conv_cols, plan.T
  HR = tiles_lib.next_pow2(K - 1)
  s, j = pl.program_id(0), pl.program_id(1)
  cols = pl.ds(j * BC, BC)
  base = base_ref[s]
  t = lax.broadcasted_iota(jnp.int32, (HR,), 0)                  # row within the sequence

  @pl.when(rb_ref[s] > 0)
  def _run():
    def window(k):
      back = t - (K - 1) + k
      v = xbc_ref[jnp.clip(base + back, 0, T - 1), cols].astype(f32)
      hv = head_ref[s, jnp.clip(back + K - 1, 0, K - 2), cols].astype(f32)
      return jnp.where((back >= 0)[:, None], v, hv)

    out = _output(plan, w_ref, bias_ref, cols, window)
    own = (t < K - 1) & (t < rb_ref[s])
    backend.store(post_out_ref.at[pl.ds(base, HR), cols], out.astype(post_out_ref.dtype),
                  own[:, None])


def body_conv(plan: ChunkPlan, xbc, live, base, rb, conv0, conv_weight, conv_bias):
  """Post-conv body rows [conv_T, C] (xbc's dtype) of xbc [T, C].

  live [conv_T] int32 (`_conv_kernel`); base, rb [S] int32: each sequence's first row and
  body rows; conv0 [S, C, K-1]: the conv state before each sequence.
  """
  cfg = plan.cfg
  C = cfg.conv_dim
  launch = lambda kernel, **kw: backend.pallas_call(
      lambda **refs: kernel(**refs, plan=plan), num_warps=plan.tiles.conv_warps,
      num_stages=1, interpret=plan.interpret, **kw)
  post = launch(
      _conv_kernel,
      inputs=dict(xbc_ref=xbc, live_ref=live, w_ref=conv_weight, bias_ref=conv_bias),
      outputs=dict(post_ref=jax.ShapeDtypeStruct((plan.conv_T, C), plan.y_dtype)),
      grid=(plan.conv_T // plan.conv_rows, C // plan.conv_cols),
      name=f"m2v_chunk_conv_{cfg.replay_mode}")["post_ref"]
  return launch(
      _head_kernel,
      inputs=dict(xbc_ref=xbc, base_ref=base, rb_ref=rb, head_ref=jnp.swapaxes(conv0, 1, 2),
                  w_ref=conv_weight, bias_ref=conv_bias, post_ref=post),
      outputs=dict(post_out_ref=jax.ShapeDtypeStruct(post.shape, post.dtype)),
      aliases=dict(post_ref="post_out_ref"), grid=(plan.S, C // plan.conv_cols),
      name=f"m2v_chunk_conv_head_{cfg.replay_mode}")["post_out_ref"]

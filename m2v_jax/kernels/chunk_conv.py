"""The causal conv of a chunked prefill's bodies into the slots' scratch rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels import chunk_scan
from m2v_jax.kernels.chunk_scan import ChunkPlan, Segment, Slots

f32 = jnp.float32
INTERPRET_UNROLL = 8     # body-conv rows per loop step interpreted (compiled: all of a block's)


def _weights(plan, w_ref, bias_ref, cols, rows=False):
  """The K taps and the bias of channels `cols` as float32, each [BC] ([1, BC] with `rows`)."""
  load = lambda v: v.astype(f32)[None, :] if rows else v.astype(f32)
  return [load(w_ref[cols, k]) for k in range(plan.cfg.d_conv)], load(bias_ref[cols])


def _output(plan, w_ref, bias_ref, cols, window):
  """Post-conv rows [rows, BC] from `window(k)`, the rows' tap k as float32."""
  taps, bias = _weights(plan, w_ref, bias_ref, cols, rows=True)
  return rowmath.conv_output(taps, [lambda k=k: window(k) for k in range(len(taps))], bias,
                             plan.y_dtype, not plan.interpret, plan.silu)


def _conv_kernel(*, xbc_ref, seq_ref, row_ref, len_ref, body_ref, valid_ref, w_ref, bias_ref,
                 post_ref, plan: ChunkPlan):
  """Body conv, grid (rows / conv_rows, C / conv_cols): block q of slot q // (L / conv_rows),
  one row at a time with the last K-1 input rows carried, so each input row is loaded once;
  taps from the previous rows of xbc (`_head_kernel` then rewrites each body's first K-1
  rows); rows past the slot's are zero; slots that do not run are left unwritten (not read).

  Refs:
    xbc_ref   [T, C]           raw rows, sequences back to back
    seq_ref, row_ref, len_ref, body_ref [slots] int32, valid_ref [S+1] int32: `Slots`
    w_ref     [C, K] f32, bias_ref [C] f32
    post_ref  [rows, C]        post-conv rows in the activation dtype, L per body slot of the
                               segment
  """
  K, BR, BC, T, L = plan.cfg.d_conv, plan.conv_rows, plan.conv_cols, plan.T, plan.chunk
  U = min(INTERPRET_UNROLL, BR) if plan.interpret else BR
  q, j = pl.program_id(0), pl.program_id(1)
  i = q // (L // BR)
  t0 = (q % (L // BR)) * BR                                       # first row in the slot
  cols = pl.ds(j * BC, BC)

  @pl.when((body_ref[i] > 0) & (valid_ref[seq_ref[i]] > 0))
  def _conv():
    r0, n = row_ref[i] + t0, len_ref[i]
    load = lambda r: xbc_ref[jnp.clip(r, 0, T - 1), cols].astype(f32)       # [BC]
    taps, bias = _weights(plan, w_ref, bias_ref, cols)

    def rows(g, win):
      win = list(win) + [load(r0 + g * U + u) for u in range(U)]   # loads before any store
      for u in range(U):
        t = g * U + u
        out = rowmath.conv_output(taps, win[u:u + K], bias, plan.y_dtype, not plan.interpret,
                                   plan.silu)
        live = jnp.broadcast_to(t0 + t < n, (BC,))
        post_ref[q * BR + t, cols] = jnp.where(live, out, 0.0).astype(post_ref.dtype)
      return tuple(win[-(K - 1):])

    first = tuple(load(r0 - (K - 1) + k) for k in range(K - 1))
    if BR == U:
      rows(0, first)
    else:
      lax.fori_loop(0, BR // U, rows, first)


def _head_kernel(*, xbc_ref, base_ref, rb_ref, first_ref, head_ref, w_ref, bias_ref, post_ref,
                 post_out_ref, plan: ChunkPlan):
  """The first K-1 rows of each body, their earlier taps from the sequence's conv state,
  grid (S, C / conv_cols).

    base_ref, rb_ref, first_ref [S] int32: first flat row, body rows (0: nothing to do, or a
      body opening in another segment), first slot; head_ref [S, K-1, C]: conv state before
      each sequence, oldest first; post_ref: `_conv_kernel`'s rows, aliased to post_out_ref.
  """
  K, BC, T, L = plan.cfg.d_conv, plan.conv_cols, plan.T, plan.chunk
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
    backend.store(post_out_ref.at[pl.ds(first_ref[s] * L, HR), cols],
                  out.astype(post_out_ref.dtype), own[:, None])


def body_conv(plan: ChunkPlan, seg: Segment, slots: Slots, valid, xbc, base, rb, conv0,
              conv_weight, conv_bias):
  """Post-conv body rows [seg.body * L, C] (xbc's dtype) of xbc [T, C], L per body slot of
  segment `seg` (`slots`: its view).

  valid [S+1] int32 (1: runs); base, rb [S] int32: each sequence's first row and body rows
  (0 for one that does not run); conv0 [S, C, K-1]: the conv state before each sequence.
  """
  cfg = plan.cfg
  C = cfg.conv_dim
  rows = seg.body * plan.chunk
  tag = chunk_scan.kernel_tag(plan, seg)
  if slots.opens is not None:
    rb = jnp.where(slots.opens[:plan.S] > 0, rb, 0)          # its first rows are elsewhere
  launch = lambda kernel, **kw: backend.pallas_call(
      lambda **refs: kernel(**refs, plan=plan), num_warps=plan.tiles.conv_warps,
      num_stages=1, interpret=plan.interpret, **kw)
  post = launch(
      _conv_kernel,
      inputs=dict(xbc_ref=xbc, seq_ref=slots.seq, row_ref=slots.row0, len_ref=slots.rows,
                  body_ref=slots.body, valid_ref=valid, w_ref=conv_weight,
                  bias_ref=conv_bias),
      outputs=dict(post_ref=jax.ShapeDtypeStruct((rows, C), plan.y_dtype)),
      grid=(rows // plan.conv_rows, C // plan.conv_cols),
      name=f"m2v_chunk_conv_{tag}")["post_ref"]
  return launch(
      _head_kernel,
      inputs=dict(xbc_ref=xbc, base_ref=base, rb_ref=rb, first_ref=slots.first[:plan.S],
                  head_ref=jnp.swapaxes(conv0, 1, 2), w_ref=conv_weight, bias_ref=conv_bias,
                  post_ref=post),
      outputs=dict(post_out_ref=jax.ShapeDtypeStruct(post.shape, post.dtype)),
      aliases=dict(post_ref="post_out_ref"), grid=(plan.S, C // plan.conv_cols),
      name=f"m2v_chunk_conv_head_{tag}")["post_out_ref"]

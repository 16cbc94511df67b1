"""The causal conv of a chunked prefill's bodies into the slots' scratch rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import chunk_scan
from m2v_jax.kernels.chunk_scan import ChunkPlan, Segment, Slots

f32 = jnp.float32
INTERPRET_UNROLL = 8     # body-conv rows per loop step interpreted (compiled: all of a block's)


def _weights(plan, w_ref, bias_ref, cols):
  """The K taps and the bias of channels `cols` as float32, each [BC]."""
  return ([w_ref[cols, k].astype(f32) for k in range(plan.cfg.d_conv)],
          bias_ref[cols].astype(f32))


def _conv_kernel(*, xbc_ref, seq_ref, row_ref, len_ref, body_ref, seqs_ref, base_ref, rb_ref,
                 head_ref, w_ref, bias_ref, post_ref, plan: ChunkPlan):
  """Body conv, grid (rows / conv_rows, C / conv_cols): block q of slot q // (L / conv_rows),
  one row at a time with the last K-1 input rows carried, so each input row is loaded once;
  taps from the previous rows of xbc, or before a body's first row (the block that opens it)
  from the sequence's conv state; rows past the slot's are zero; slots that do not run are
  left unwritten (not read).

  Refs:
    xbc_ref   [T, C]           raw rows, sequences back to back
    seq_ref, row_ref, len_ref, body_ref [slots] int32: `Slots`
    seqs_ref  [7, S+1] int32   per-sequence table (`chunk_scan.seq_table`)
    base_ref, rb_ref [S] int32 first flat row and body rows of each sequence (rb 0: its body
                               opens in another segment)
    head_ref  [S, K-1, C]      conv state before each sequence, oldest row first
    w_ref     [C, K] f32, bias_ref [C] f32
    post_ref  [rows, C]        post-conv rows in the activation dtype, L per body slot of the
                               segment
  """
  K, BR, BC, T, L, S = (plan.cfg.d_conv, plan.conv_rows, plan.conv_cols, plan.T, plan.chunk,
                        plan.S)
  U = min(INTERPRET_UNROLL, BR) if plan.interpret else BR
  q, j = pl.program_id(0), pl.program_id(1)
  i = q // (L // BR)
  t0 = (q % (L // BR)) * BR                                       # first row in the slot
  cols = pl.ds(j * BC, BC)
  s = jnp.minimum(seq_ref[i], S - 1)

  @pl.when((body_ref[i] > 0) & (seqs_ref[chunk_scan.RUNS, seq_ref[i]] > 0))
  def _conv():
    r0, n = row_ref[i] + t0, len_ref[i]
    load = lambda r: xbc_ref[jnp.clip(r, 0, T - 1), cols].astype(f32)       # [BC]
    taps, bias = _weights(plan, w_ref, bias_ref, cols)
    opens = (r0 == base_ref[s]) & (rb_ref[s] > 0)

    def rows(g, win):
      win = list(win) + [load(r0 + g * U + u) for u in range(U)]   # loads before any store
      for u in range(U):
        t = g * U + u
        out = rowmath.conv_output(taps, win[u:u + K], bias, plan.y_dtype, not plan.interpret,
                                   plan.silu)
        live = jnp.broadcast_to(t0 + t < n, (BC,))
        post_ref[q * BR + t, cols] = jnp.where(live, out, 0.0).astype(post_ref.dtype)
      return tuple(win[-(K - 1):])

    first = tuple(jnp.where(opens, head_ref[s, k, cols].astype(f32), load(r0 - (K - 1) + k))
                  for k in range(K - 1))
    if BR == U:
      rows(0, first)
    else:
      lax.fori_loop(0, BR // U, rows, first)


def body_conv(plan: ChunkPlan, seg: Segment, slots: Slots, seqs, xbc, base, rb, conv0,
              conv_weight, conv_bias):
  """Post-conv body rows [seg.body * L, C] (xbc's dtype) of xbc [T, C], L per body slot of
  segment `seg` (`slots`: its view).

  seqs [7, S+1] int32: the segment's per-sequence table (`chunk_scan.seq_table`; the slots
  of a sequence that does not run are left alone); base, rb [S] int32: each sequence's first
  row and body rows (numpy where the host knows them); conv0 [S, C, K-1]: the conv state
  before each sequence.
  """
  cfg = plan.cfg
  C = cfg.conv_dim
  rows = seg.body * plan.chunk
  tag = chunk_scan.kernel_tag(plan, seg)
  if slots.opens is not None:                                # its first rows are elsewhere
    xp = np if all(isinstance(a, np.ndarray) for a in (rb, slots.opens)) else jnp
    rb = xp.where(slots.opens[:plan.S] > 0, rb, 0).astype(np.int32)
  return backend.pallas_call(
      lambda **refs: _conv_kernel(**refs, plan=plan),
      inputs=dict(xbc_ref=xbc, seq_ref=slots.seq, row_ref=slots.row0, len_ref=slots.rows,
                  body_ref=slots.body, seqs_ref=seqs, base_ref=base, rb_ref=rb,
                  head_ref=jnp.swapaxes(conv0, 1, 2), w_ref=conv_weight, bias_ref=conv_bias),
      outputs=dict(post_ref=jax.ShapeDtypeStruct((rows, C), plan.y_dtype)),
      grid=(rows // plan.conv_rows, C // plan.conv_cols), num_warps=plan.tiles.conv_warps,
      num_stages=1, interpret=plan.interpret, name=f"m2v_chunk_conv_{tag}")["post_ref"]

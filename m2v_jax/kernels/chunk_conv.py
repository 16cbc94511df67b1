"""The causal conv and processed dt of a chunked prefill's bodies into the slots' scratch rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import chunk_scan
from m2v_jax.kernels import tiles as tiles_lib
from m2v_jax.kernels.chunk_scan import ChunkPlan, Segment, Slots

f32 = jnp.float32
INTERPRET_UNROLL = 8     # body-conv rows per loop step interpreted (compiled: all of a block's)
DT_ROWS = 8              # dt rows per loop step


def _weights(plan, w_ref, bias_ref, cols):
  """The K taps and the bias of channels `cols` as float32, each [BC]."""
  return ([w_ref[cols, k].astype(f32) for k in range(plan.cfg.d_conv)],
          bias_ref[cols].astype(f32))


def _conv_kernel(*, xbc_ref, dt_ref, seq_ref, row_ref, len_ref, body_ref, seqs_ref, ci_ref=None,
                 sr_ref=None, base_ref, rb_ref, head_ref, w_ref, bias_ref, dtb_ref, post_ref,
                 dtr_ref, seqs_out_ref=None, plan: ChunkPlan):
  """Body conv and dt, grid (rows / conv_rows, C / conv_cols + 1): block q of slot
  q // (L / conv_rows); the first column of programs processes the block's dt (first, so
  that those programs start with the conv's, not after them). The conv runs
  one row at a time with the last K-1 input rows carried, so each input row is loaded once;
  taps from the previous rows of xbc, or before a body's first row (the block that opens it)
  from the sequence's conv state; rows past the slot's are zero; slots that do not run are
  left unwritten (not read). dt is written for every block, zero past the slot's rows and
  where the sequence does not run.

  Refs:
    xbc_ref   [T, C]           raw rows, sequences back to back
    dt_ref    [T, H]           raw dt of the rows
    seq_ref, row_ref, len_ref, body_ref [slots] int32: `Slots`
    seqs_ref  [7, S+1] int32   per-sequence table (`chunk_scan.seq_table`); with ci_ref, its
                               rows RUNS, ENTRY, START are formed here (`CallSeqs`)
    ci_ref, sr_ref [S] int32   the call's cache_indices and state_row (`CallSeqs`), or None
    base_ref, rb_ref [S] int32 first flat row and body rows of each sequence (rb 0: its body
                               opens in another segment)
    head_ref  [E, S, C, K-1] / [E, C, K-1]  the pool's conv states (snapshot / compact): a
                               sequence's taps before its first row, at its entry (and
                               starting slot), loaded only in the block that opens a body
    w_ref     [C, K] f32, bias_ref [C] f32, dtb_ref [H] f32 (dt_bias)
    post_ref  [rows, C]        post-conv rows in the activation dtype, L per body slot of the
                               segment
    dtr_ref   [rows, H] f32    processed dt of the same rows
    seqs_out_ref [7, S+1] int32  with ci_ref: the whole table, for the segment's other kernels
  """
  cfg = plan.cfg
  K, BR, BC, T, L, S = cfg.d_conv, plan.conv_rows, plan.conv_cols, plan.T, plan.chunk, plan.S
  H = cfg.nheads
  U = min(INTERPRET_UNROLL, BR) if plan.interpret else BR
  q, j = pl.program_id(0), pl.program_id(1)
  i = q // (L // BR)
  t0 = (q % (L // BR)) * BR                                       # first row in the slot
  cols = pl.ds((j - 1) * BC, BC)
  s = jnp.minimum(seq_ref[i], S - 1)
  if ci_ref is None:
    runs = seqs_ref[chunk_scan.RUNS, seq_ref[i]] > 0
    at = chunk_scan.pool_entry(plan, seqs_ref, s)
  else:
    runs, entry, start = chunk_scan.call_rows(plan, ci_ref[s], sr_ref[s], seq_ref[i])
    runs, at = runs > 0, chunk_scan.pool_index(plan, entry, start)

    @pl.when((q == 0) & (j == 0))
    def _table():                    # the table's S+1 columns as one padded vector
      k = lax.broadcasted_iota(jnp.int32, (tiles_lib.next_pow2(S + 1),), 0)
      seqs = pl.ds(q, k.shape[0])    # q = 0, traced: the vector reaches past them, masked
      known, cols = k < S, k < S + 1
      rows = chunk_scan.call_rows(plan, backend.load(ci_ref.at[seqs], known, other=-1),
                                  backend.load(sr_ref.at[seqs], known, other=0), k)
      for f in range(seqs_out_ref.shape[0]):
        field = (pl.ds(f, 1), seqs)
        v = (rows[f][None, :] if f <= chunk_scan.START else
             backend.load(seqs_ref.at[field], cols[None, :], other=0))
        backend.store(seqs_out_ref.at[field], v, cols[None, :])

  runs = (body_ref[i] > 0) & runs

  @pl.when(j == 0)
  def _dt():                         # DT_ROWS rows a step: few registers next to the conv's
    BH, G = tiles_lib.pow2_divisor(H, 128), min(DT_ROWS, BR)

    def step(g, c):
      r = t0 + g * G + lax.broadcasted_iota(jnp.int32, (G, 1), 0)
      live = runs & (r < len_ref[i])
      src = jnp.clip(row_ref[i] + r[:, 0], 0, T - 1)
      for hb in range(H // BH):
        hs = pl.ds(hb * BH, BH)
        dtp = rowmath.process_dt(dt_ref[src, hs].astype(f32), dtb_ref[hs][None, :],
                                 cfg.dt_limit)
        dtr_ref[pl.ds(q * BR + g * G, G), hs] = jnp.where(live, dtp, 0.0)
      return c

    lax.fori_loop(0, BR // G, step, 0)

  @pl.when(runs & (j > 0))
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

    # The pool's strided window only where the block opens the body (masked elsewhere).
    head = lambda k: backend.load(head_ref.at[at + (cols, pl.ds(k, 1))], opens)[:, 0]
    first = tuple(jnp.where(opens, head(k).astype(f32), load(r0 - (K - 1) + k))
                  for k in range(K - 1))
    if BR == U:
      rows(0, first)
    else:
      lax.fori_loop(0, BR // U, rows, first)


def body_conv(plan: ChunkPlan, seg: Segment, slots: Slots, seqs, xbc, dt, base, rb, conv,
              conv_weight, conv_bias, dt_bias):
  """(post-conv body rows [seg.body * L, C] in xbc's dtype, processed dt [seg.body * L, H]
  float32, the per-sequence table [7, S+1] int32 for the segment's other kernels) of xbc
  [T, C] and dt [T, H], L rows per body slot of segment `seg` (`slots`: its view), zero past
  a slot's rows (dt also where its sequence does not run).

  seqs: the segment's per-sequence table (`chunk_scan.seq_table`, [7, S+1] int32; the slots
  of a sequence that does not run are left alone), returned as it is, or a
  `chunk_scan.CallSeqs`, whose table the kernel completes; base, rb [S] int32: each
  sequence's first row and body rows (numpy where the host knows them); conv: the pool's
  conv states ([E, S, C, K-1] snapshot, [E, C, K-1] compact), each sequence's read at its
  entry and starting slot; conv_weight [C, K], conv_bias [C], dt_bias [H] float32.
  """
  cfg = plan.cfg
  C, H = cfg.conv_dim, cfg.nheads
  rows = seg.body * plan.chunk
  tag = chunk_scan.kernel_tag(plan, seg)
  if slots.opens is not None:                                # its first rows are elsewhere
    xp = np if all(isinstance(a, np.ndarray) for a in (rb, slots.opens)) else jnp
    rb = xp.where(slots.opens[:plan.S] > 0, rb, 0).astype(np.int32)
  call = isinstance(seqs, chunk_scan.CallSeqs)
  table = seqs.table if call else seqs
  out = backend.pallas_call(
      lambda **refs: _conv_kernel(**refs, plan=plan),
      inputs=dict(xbc_ref=xbc, dt_ref=dt, seq_ref=slots.seq, row_ref=slots.row0,
                  len_ref=slots.rows, body_ref=slots.body, seqs_ref=table,
                  ci_ref=seqs.cache_indices if call else None,
                  sr_ref=seqs.state_row if call else None, base_ref=base,
                  rb_ref=rb, head_ref=conv, w_ref=conv_weight, bias_ref=conv_bias,
                  dtb_ref=dt_bias),
      outputs=dict(post_ref=jax.ShapeDtypeStruct((rows, C), plan.y_dtype),
                   dtr_ref=jax.ShapeDtypeStruct((rows, H), f32),
                   seqs_out_ref=jax.ShapeDtypeStruct(table.shape, jnp.int32) if call else None),
      grid=(rows // plan.conv_rows, C // plan.conv_cols + 1), num_warps=plan.tiles.conv_warps,
      num_stages=1, interpret=plan.interpret, name=f"m2v_chunk_conv_{tag}")
  return out["post_ref"], out["dtr_ref"], out["seqs_out_ref"] if call else seqs

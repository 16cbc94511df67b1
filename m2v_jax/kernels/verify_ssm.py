"""The verify path's SSM launch: the compact fold, y in the SSD dual form, the states."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import status
from m2v_jax.kernels import backend
from m2v_jax.kernels import dual
from m2v_jax.kernels import rowmath

f32 = jnp.float32


def window_segments(starts, n_fold):
  """(segments, start and length of segment i as a function of i) of the pending rows
  [0, n_fold), which the `starts` bitmask cuts where a call began."""
  j = lax.broadcasted_iota(jnp.int32, (32,), 0)
  live = j < n_fold
  bits = jnp.where(live, (starts >> j) & 1, 0)
  seg = jnp.cumsum(bits)                         # 1 + the segment of row j

  def segment(i):
    return (jnp.sum(jnp.where(live & (seg <= i), 1, 0)),
            jnp.sum(jnp.where(live & (seg == i + 1), 1, 0)))

  return jnp.sum(bits), segment


def _ssm_kernel(*, idx_ref, row_ref, n_ref, fold_ref, prev_starts_ref=None,
                prev_origin_ref=None, xr_ref=None, dtr_ref=None, z_ref=None, alog_ref, d_ref,
                ssm_ref, wxb_ref=None, wdt_ref=None, pend_ref=None, starts_ref=None,
                origin_ref=None, ssm_out_ref, pend_out_ref=None, starts_out_ref=None,
                origin_out_ref=None, y_ref=None, plan):
  """Fold, y and states of one head's [block_p, N] state tile, grid (P / block_p, B, H).

  Refs (E pool entries, B sequences, RT scratch rows, Q ring rows, XB = H*P + G*N):
    idx_ref, row_ref, n_ref  [B] int32    cache_indices, state_row, num_rows
    fold_ref        [B] int32             from the conv launch: rows to fold, -1: rejected
    prev_starts_ref, prev_origin_ref  compact [B] int32   from the conv launch: the window's
                                          `starts` and `origin` before the call
    xr_ref          [B, RT, C]            post-conv rows (activation dtype, zero past num_rows)
    dtr_ref         [B, RT, H] f32        their processed dt
    z_ref           [B, R, H*P]           optional gate
    alog_ref, d_ref  [H] f32              A_log, D
    ssm_ref         snapshot [E, S, H, P, N], compact [E, H, P, N], in the state dtype;
                    aliased to ssm_out_ref
    wxb_ref, wdt_ref  compact [E, Q, XB], [E, Q, H]   the ring: post-conv x and B, dt
    pend_ref, starts_ref, origin_ref  compact [E] int32; aliased to the *_out_refs (only
                                          written here)
    y_ref           [B, R, H*P]           y (absent in a fold)

  The state is held as N / n_cols chunks [block_p, n_cols]. Compact mode first folds the
  pending rows, one call's segment at a time (`dual.fold`, a loop whose trip count is the
  number of segments), rounding a 16-bit state after each as snapshot mode stored it. Then
  the new rows' segments: y from each segment's start state (`dual.outputs`), the state
  after a body segment, and, in snapshot mode, the state after every kept row (its slot).
  """
  cfg, R, body, cap, KT = plan.cfg, plan.R, plan.body, plan.cap, plan.KT
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  BP, NC = plan.block_p, plan.n_cols
  chunks = [pl.ds(k * NC, NC) for k in range(N // NC)]
  mm = backend.Products(plan.exact_rows, tensor_cores=not plan.interpret)
  triton = not plan.interpret

  pid_p, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  entry = idx_ref[b]
  e = status.safe_entry(entry, plan.E)
  n_fold = fold_ref[b]
  valid, pad, n_fold = n_fold >= 0, entry == -1, jnp.maximum(n_fold, 0)
  n = jnp.clip(n_ref[b], 0, R)
  g = h // cfg.heads_per_group
  A, D = -jnp.exp(alog_ref[h]), d_ref[h]
  ps = pl.ds(pid_p * BP, BP)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  kt = lax.broadcasted_iota(jnp.int32, (KT,), 0)

  def tile(src_ref, dt_src, rows, with_c):
    """x [KT, BP], B (and C) chunks [KT, NC] as float32, dt [KT] of the rows `rows` (a
    slice, or a vector of ring rows) of sequence or entry `src`."""
    x = src_ref[rows + (xcols,)].astype(f32)
    bm = [src_ref[rows + (pl.ds(HP + g * N + c.start, NC),)].astype(f32) for c in chunks]
    cm = ([src_ref[rows + (pl.ds(HP + GN + g * N + c.start, NC),)].astype(f32)
           for c in chunks] if with_c else None)
    return x, bm, cm, dt_src[rows + (h,)]

  def rounded(S):                      # the value a store then a load would give
    return [rowmath.stored(s, plan.state_dtype, triton) for s in S]

  def store_state(S, *slot):
    for c, s in zip(chunks, S):
      ssm_out_ref[(e,) + slot + (h, ps, c)] = s.astype(ssm_out_ref.dtype)

  def store_y(y, t0, L):
    """y rows t0 .. t0 + L - 1 (L static) of the call from the segment's y [BP, KT]
    (rows at or past num_rows get 0), gated."""
    if not body and R == KT and not plan.has_z:
      y_ref[b, pl.ds(0, KT), xcols] = jnp.where((kt < n)[None, :], y, 0.0).T.astype(y_ref.dtype)
      return
    cols = lax.broadcasted_iota(jnp.int32, (BP, KT), 1)
    for t in range(L):
      yt = jnp.sum(jnp.where(cols == t, y, 0.0), axis=1)
      if plan.has_z:
        yt = rowmath.gate(yt, z_ref[b, t0 + t, xcols].astype(f32))
      y_ref[b, t0 + t, xcols] = jnp.where(t0 + t < n, yt, 0.0).astype(y_ref.dtype)

  @pl.when(valid)
  def _run():
    slot = () if plan.compact else (row_ref[b],)
    S = [ssm_ref[(e,) + slot + (h, ps, c)].astype(f32) for c in chunks]
    if plan.compact:
      starts, origin = prev_starts_ref[b], prev_origin_ref[b]
      count, segment = window_segments(starts, n_fold)

      def fold_segment(i, S):
        s0, L = segment(i)
        rows = (origin + s0 + kt) % cfg.ring_rows
        x, bm, _, dtv = tile(wxb_ref, wdt_ref, (e, rows), False)
        return rounded(dual.fold(S, x, bm, dtv, A, kt < L, L - 1, mm))

      S = lax.fori_loop(0, count, fold_segment, S)
      flush = status.flushes(cfg, R, n_fold, n)
      if not body:
        pl.when((n_fold > 0) & flush)(lambda: store_state(S))

      @pl.when((pid_p == 0) & (h == 0))
      def _():
        woff, new_pending, new_starts = status.window_after(cfg, R, n_fold, n, starts, flush)
        del woff
        pend_out_ref[e] = new_pending
        starts_out_ref[e] = new_starts
        origin_out_ref[e] = status.ring_origin(cfg, origin, n_fold, flush)
    if not R:
      return

    def new_tile(t0, L):
      x, bm, cm, dtv = tile(xr_ref, dtr_ref, (b, pl.ds(t0, KT)), True)
      return x, bm, cm, dtv, (kt < L) & (t0 + kt < n)

    def body_segment(t0, L, S):
      x, bm, cm, dtv, live = new_tile(t0, L)
      store_y(dual.outputs(S, x, bm, cm, dtv, A, D, live, mm), t0, L)
      return dual.fold(S, x, bm, dtv, A, live, L - 1, mm)

    if body:
      full = body // cap
      if full:
        S = lax.fori_loop(0, full, lambda j, S: body_segment(j * cap, cap, S), S)
      if body % cap:
        S = body_segment(full * cap, body % cap, S)
      S = rounded(S)
      if plan.compact:
        store_state(S)

    x, bm, cm, dtv, live = new_tile(body, min(R, cap))
    store_y(dual.outputs(S, x, bm, cm, dtv, A, D, live, mm), body, min(R, cap))
    if not plan.compact:
      for r in range(min(R, cap)):
        def store_slot(r=r):
          store_state(dual.fold(S, x, bm, dtv, A, live, r, mm), r)
        pl.when(body + r < n)(store_slot)

  if R:
    @pl.when(~valid)
    def _fill():
      fill = jnp.where(pad, jnp.zeros((BP,), f32), jnp.full((BP,), jnp.nan, f32))

      def fill_row(i, c):
        y_ref[b, i, xcols] = fill.astype(y_ref.dtype)
        return c

      lax.fori_loop(0, R, fill_row, 0)


def ssm(plan, params, state, prepped, state_row, z, cache_indices, num_rows):
  """Runs the SSM launch of `plan` (a `verify.Plan`) on the conv launch's outputs. Returns
  its outputs by name (`_ssm_kernel`)."""
  cfg = plan.cfg
  H, P = cfg.nheads, cfg.headdim
  sds = jax.ShapeDtypeStruct
  compact = plan.compact
  i32 = jnp.int32
  return backend.pallas_call(
      lambda **refs: _ssm_kernel(**refs, plan=plan),
      inputs=dict(idx_ref=cache_indices, row_ref=state_row, n_ref=num_rows,
                  fold_ref=prepped["fold_ref"], prev_starts_ref=prepped.get("prev_starts_ref"),
                  prev_origin_ref=prepped.get("prev_origin_ref"),
                  xr_ref=prepped.get("xr_ref"), dtr_ref=prepped.get("dtr_ref"),
                  z_ref=z if plan.has_z else None, alog_ref=params.A_log, d_ref=params.D,
                  ssm_ref=state.ssm, wxb_ref=prepped.get("wxb_out_ref"),
                  wdt_ref=prepped.get("wdt_out_ref"),
                  pend_ref=state.pending if compact else None,
                  starts_ref=state.starts if compact else None,
                  origin_ref=state.origin if compact else None),
      outputs=dict(ssm_out_ref=sds(state.ssm.shape, plan.state_dtype),
                   pend_out_ref=sds((plan.E,), i32) if compact else None,
                   starts_out_ref=sds((plan.E,), i32) if compact else None,
                   origin_out_ref=sds((plan.E,), i32) if compact else None,
                   y_ref=sds((plan.B, plan.R, cfg.d_inner), plan.y_dtype) if plan.R else None),
      aliases=dict(ssm_ref="ssm_out_ref", pend_ref="pend_out_ref",
                   starts_ref="starts_out_ref", origin_ref="origin_out_ref"),
      grid=(P // plan.block_p, plan.B, H),
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages,
      interpret=plan.interpret,
      name=f"m2v_ssm_{cfg.replay_mode}_r{plan.R}")

"""The verify path's SSM launch: the compact fold, y in the SSD dual form, the states."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import status
from m2v_jax.kernels import backend
from m2v_jax.kernels import dual
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import verify_conv

f32 = jnp.float32


# Rows the compact fold loads ahead, to overlap their latency with the fold.
FOLD_AHEAD = 1


def _ssm_kernel(*, idx_ref, row_ref, n_ref, fold_ref=None, prev_starts_ref=None,
                prev_origin_ref=None, xr_ref=None, dtr_ref=None, xbc_ref=None, dt_ref=None,
                w_ref=None, bias_ref=None, dtb_ref=None, conv_ref=None, last_ref=None,
                z_ref=None, alog_ref, d_ref, ssm_ref, wxb_ref=None, wdt_ref=None, pend_ref=None,
                starts_ref=None, origin_ref=None, cnt_ref=None, ssm_out_ref, pend_out_ref=None,
                starts_out_ref=None, origin_out_ref=None, conv_out_ref=None, last_out_ref=None,
                wxb_out_ref=None, wdt_out_ref=None, cnt_out_ref=None, y_ref=None, plan):
  """Fold, y and states of one head's [block_p, N] state tile, grid (P / block_p, H, B).

  Refs (Q ring rows, XB = H*P + G*N, K1 = K-1; compact-only refs are None in snapshot mode):
    idx_ref, row_ref, n_ref           [B] int32       cache_indices, state_row, num_rows
    two launches (after `verify_conv.conv`):
      fold_ref                        [B] int32       rows to fold, -1: rejected
      prev_starts_ref, prev_origin_ref [B] int32      starts, origin before the call
      xr_ref [B, RT, C], dtr_ref [B, RT, H] f32       post-conv rows, processed dt
    fused (`plan.fused`: the conv of the head's x columns and its group's B and C columns):
      xbc_ref [B, R, C], dt_ref [B, R, H]             raw new rows
      w_ref [C, K], bias_ref [C], dtb_ref [H]         float32 params
      conv_ref [E, S, C, K1] / [E, C, K1]             -> conv_out_ref (aliased)
      last_ref [E, cap, C]                            -> last_out_ref (aliased)
      cnt_ref [E, G, 2] int32 (zero)                  -> cnt_out_ref: arrivals per group, and
                                                         per sequence in [e, 0, 1]
    z_ref [B, R, H*P]                                 optional gate
    alog_ref, d_ref                   [H] f32
    ssm_ref    [E, S, H, P, N] / [E, H, P, N]         -> ssm_out_ref (aliased)
    wxb_ref [E, Q, XB], wdt_ref [E, Q, H]             the ring (fused: -> *_out_ref, aliased)
    pend_ref, starts_ref, origin_ref  [E] int32       -> *_out_ref (aliased)
    y_ref      [B, R, H*P]                            (None in a fold)

  Fused, the group's B and C columns of the conv state are read by all its programs, so the
  last of them to arrive (`cnt_ref`) writes them; the last group writes the window status.
  """
  cfg, R, body, cap, KT = plan.cfg, plan.R, plan.body, plan.cap, plan.KT
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  BP, NC = plan.block_p, plan.n_cols
  chunks = [pl.ds(k * NC, NC) for k in range(N // NC)]
  mm = backend.Products(plan.exact_rows, tensor_cores=not plan.interpret,
                        bf16_rows=plan.y_dtype == jnp.bfloat16)
  fma = backend.fma(plan.interpret)
  triton = not plan.interpret

  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  entry = idx_ref[b]
  pad = entry == -1
  if plan.fused:
    e, row0, n, valid, n_fold, pending, starts = verify_conv.load_status(
        plan, b, idx_ref, row_ref, n_ref, pend_ref, starts_ref)
    origin = origin_ref[e] if plan.compact else None
  else:
    e = status.safe_entry(entry, plan.E)
    n_fold = fold_ref[b]
    valid, n_fold = n_fold >= 0, jnp.maximum(n_fold, 0)
    n = jnp.clip(n_ref[b], 0, R)
    if plan.compact:
      starts, origin = prev_starts_ref[b], prev_origin_ref[b]
  g = h // cfg.heads_per_group
  A, D = -jnp.exp(alog_ref[h]), d_ref[h]
  ps = pl.ds(pid_p * BP, BP)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  bcols = [pl.ds(HP + g * N + c.start, NC) for c in chunks]
  kt = lax.broadcasted_iota(jnp.int32, (KT,), 0)

  def row(src_ref, dt_ref, *at):
    """One row's x [BP, 1], B chunks [1, NC] (float32) and processed dt."""
    lead, r = at[:-1], at[-1]
    x = src_ref[lead + (r, xcols)].astype(f32)[:, None]
    bm = [src_ref[lead + (pl.ds(r, 1), c)].astype(f32) for c in bcols]
    return x, bm, dt_ref[lead + (r, h)]

  def tile_row(tiles, r):
    """Row r of segment tiles, as `row` gives it."""
    x, bm, _, dtv, _ = tiles
    sel = (kt == r)[:, None]
    pick = lambda v: jnp.sum(jnp.where(sel, v, 0.0), axis=0)
    return (pick(x)[:, None], [pick(c)[None, :] for c in bm],
            jnp.sum(jnp.where(kt == r, dtv, 0.0)))

  def update(S, x, bm, dtv):
    dtx = dtv * x
    da = jnp.exp(dtv * A)
    return [rowmath.state_update(s, da, dtx, bc, fma) for s, bc in zip(S, bm)]

  def rounded(S):                      # as a store then a load would give it
    return [rowmath.stored(s, plan.state_dtype, triton) for s in S]

  def store_state(S, *slot):
    for c, s in zip(chunks, S):
      ssm_out_ref[(e,) + slot + (h, ps, c)] = s.astype(ssm_out_ref.dtype)

  def segment_tiles(t0, L):
    """x [KT, BP], B and C chunks [KT, NC], dt [KT] of rows t0.., and L scalar dts."""
    rows = (b, pl.ds(t0, KT))
    x = xr_ref[rows + (xcols,)].astype(f32)
    bm = [xr_ref[rows + (c,)].astype(f32) for c in bcols]
    cm = [xr_ref[rows + (pl.ds(HP + GN + g * N + c.start, NC),)].astype(f32) for c in chunks]
    return x, bm, cm, dtr_ref[rows + (h,)], [dtr_ref[b, t0 + k, h] for k in range(L)]

  def segment_y(S, t0, L, tiles=None):
    """Stores y of rows t0 .. t0 + L - 1 from their start state S (0 past num_rows, gated)."""
    x, bm, cm, dtv, dts = tiles or segment_tiles(t0, L)
    live = (kt < L) & (t0 + kt < n)
    cum = dual.log_decay([jnp.where(t0 + k < n, d * A, 0.0) for k, d in enumerate(dts)], KT)
    y = dual.outputs(S, x, bm, cm, dtv, A, D, live, mm, cum)  # [BP, KT]
    if not body and R == KT and not plan.has_z:
      y_ref[b, pl.ds(0, KT), xcols] = jnp.where(live[None, :], y, 0.0).T.astype(y_ref.dtype)
      return
    cols = lax.broadcasted_iota(jnp.int32, (BP, KT), 1)

    def store_row(t):
      yt = jnp.sum(jnp.where(cols == t, y, 0.0), axis=1)
      if plan.has_z:
        yt = rowmath.gate(yt, z_ref[b, t0 + t, xcols].astype(f32))
      y_ref[b, t0 + t, xcols] = jnp.where(t0 + t < n, yt, 0.0).astype(y_ref.dtype)

    backend.static_loop(L, store_row, plan.interpret)

  def new_rows(S, t0, L, store, tiles=None):
    """The state after rows t0 .. t0 + L - 1, `store(S, i)` after each; loads one row ahead
    (fused: takes them from `tiles`)."""
    def ahead(i):
      if tiles is not None:
        return tile_row(tiles, jnp.minimum(i, L - 1))
      return row(xr_ref, dtr_ref, b, t0 + jnp.minimum(i, L - 1))

    def step(i, carry):
      S, cur = carry
      loaded = ahead(i + 1)
      S = update(S, *cur)
      if store:
        store(S, i)
      return S, loaded

    return lax.fori_loop(0, L, step, (S, ahead(0)))[0]

  if plan.fused:
    K1 = cfg.d_conv - 1
    ccols = [pl.ds(HP + GN + g * N + c.start, NC) for c in chunks]
    first_of_group = (pid_p == 0) & (h % cfg.heads_per_group == 0)

    def ring(i):                       # ring row of the call's row i
      return status.ring_row(cfg, origin, n_fold + i)

    t_rows = lax.broadcasted_iota(jnp.int32, (KT,), 0)
    live_rows = t_rows < n

    def window(cs):
      return verify_conv.window(plan, conv_ref, last_ref, e, row0, pending, cs)

    def taps_in(cs, win):
      """K tiles [KT, len(cs)] float32: tap j of row t holds raw row t - K1 + j (from the
      window before the call where negative)."""
      tiles = []
      for j in range(K1 + 1):
        r = t_rows - K1 + j
        raw = xbc_ref[b, jnp.clip(r, 0, R - 1), cs].astype(f32)
        for k in range(K1):
          raw = jnp.where((r == k - K1)[:, None], win[k][None, :], raw)
        tiles.append(raw)
      return tiles

    def conv_tile(cs, taps):
      """[KT, len(cs)] post-conv rows of columns cs, 0 past num_rows."""
      w = [w_ref[cs, k][None, :] for k in range(K1 + 1)]
      out = rowmath.conv_output(w, taps, bias_ref[cs][None, :], plan.y_dtype, triton)
      return jnp.where(live_rows[:, None], out, 0.0)

    def store_rows(ref, lead, rows, cs, tail, tile, mask):
      """ref[lead + (rows[t], cs) + tail] = tile[t] where mask[t] (rows [KT] int32)."""
      if triton:
        backend.store(ref.at[lead + (rows, cs) + tail], tile.astype(ref.dtype), mask[:, None])
        return
      for t in range(KT):
        value = jnp.sum(jnp.where((t_rows == t)[:, None], tile, 0.0), axis=0)
        pl.when(mask[t])(functools.partial(ref.__setitem__, lead + (rows[t], cs) + tail,
                                           value.astype(ref.dtype)))

    def store_conv_state(cs, win, taps, mask):
      """The conv state of columns cs: compact, the window and the raw rows; snapshot, the
      window after each row in its slot."""
      if plan.compact:
        for j in range(K1):
          conv_out_ref[e, cs, j] = win[j].astype(conv_out_ref.dtype)
        store_rows(last_out_ref, (e,), t_rows, cs, (), taps[K1], mask)
      else:
        for j in range(K1):
          store_rows(conv_out_ref, (e,), t_rows, cs, (j,), taps[1 + j], mask)

    def fused_rows():
      """Segment tiles of the call's rows from the conv in this program; stores the conv state
      and ring rows of the head's x columns, the ring rows of the group's B columns (its first
      program) and the head's dt."""
      ring_rows = status.ring_row(cfg, origin, n_fold + t_rows) if plan.compact else None
      x_win = window(xcols)
      backend.barrier(plan.interpret)    # the x window is read before it is overwritten
      x_taps = taps_in(xcols, x_win)
      x = conv_tile(xcols, x_taps)
      store_conv_state(xcols, x_win, x_taps, live_rows)
      if plan.compact:
        store_rows(wxb_out_ref, (e,), ring_rows, xcols, (), x, live_rows)
      bm = [conv_tile(c, taps_in(c, window(c))) for c in bcols]
      cm = [conv_tile(c, taps_in(c, window(c))) for c in ccols]
      if plan.compact:
        for c, tile in zip(bcols, bm):
          store_rows(wxb_out_ref, (e,), ring_rows, c, (), tile, live_rows & first_of_group)
      dts, dtv = [], jnp.zeros((KT,), f32)
      for t in range(R):
        d = rowmath.process_dt(dt_ref[b, t, h].astype(f32), dtb_ref[h], cfg.dt_limit)
        d = jnp.where(t < n, d, 0.0)
        dts.append(d)
        dtv = jnp.where(kt == t, d, dtv)
        if plan.compact:
          pl.when((t < n) & (pid_p == 0))(
              functools.partial(wdt_out_ref.__setitem__, (e, ring(t), h), d))
      return x, bm, cm, dtv, dts

    def arrive(last_of_sequence):
      """Counts this program in; the group's last writes its B and C conv state, and the
      sequence's last group runs `last_of_sequence`."""
      backend.barrier(plan.interpret)
      PPG = (P // BP) * cfg.heads_per_group

      @pl.when(backend.arrive(cnt_out_ref, (e, g, 0)) == PPG - 1)
      def _group_last():
        cols = bcols + ccols
        wins = [window(c) for c in cols]
        taps = [taps_in(c, w) for c, w in zip(cols, wins)]
        backend.barrier(plan.interpret)  # the windows are read before they are overwritten
        for c, w, tp in zip(cols, wins, taps):
          store_conv_state(c, w, tp, live_rows)
        cnt_out_ref[e, g, 0] = jnp.int32(0)
        if last_of_sequence is not None:
          @pl.when(backend.arrive(cnt_out_ref, (e, 0, 1)) == G - 1)
          def _():
            last_of_sequence()
            cnt_out_ref[e, 0, 1] = jnp.int32(0)

  @pl.when(valid)
  def _run():
    L = min(R, cap)
    # The kept segment's rows do not depend on the state: their loads go out first.
    if plan.fused:
      kept = fused_rows()
    else:
      kept = segment_tiles(body, L) if R and not body else None
    slot = () if plan.compact else (row_ref[b],)
    S = [ssm_ref[(e,) + slot + (h, ps, c)].astype(f32) for c in chunks]
    if plan.compact:
      last = jnp.maximum(n_fold - 1, 0)

      def ring(r):                     # pending row r, clamped to the last folded row
        return row(wxb_ref, wdt_ref, e, status.ring_row(cfg, origin, jnp.minimum(r, last)))

      def fold_row(r, carry):
        S, ahead = carry[0], carry[1:]
        if plan.state_dtype != f32 and cfg.deferred:
          began = (((starts >> r) & 1) > 0) & (r > 0)         # a later call's first row
          S = [jnp.where(began, v, s) for v, s in zip(rounded(S), S)]
        loaded = ring(r + FOLD_AHEAD)
        return (update(S, *ahead[0]),) + ahead[1:] + (loaded,)

      carry = (S,) + tuple(ring(r) for r in range(FOLD_AHEAD))
      S = rounded(lax.fori_loop(0, n_fold, fold_row, carry)[0])
      flush = status.flushes(cfg, R, n_fold, n)
      if not body:
        pl.when((n_fold > 0) & flush)(lambda: store_state(S))

      def store_status():
        _, new_pending, new_starts = status.window_after(cfg, R, n_fold, n, starts, flush)
        pend_out_ref[e] = new_pending
        starts_out_ref[e] = new_starts
        origin_out_ref[e] = status.ring_origin(cfg, origin, n_fold, flush)

      if not plan.fused:
        pl.when((pid_p == 0) & (h == 0))(store_status)
    if not R:
      return

    if body:
      full = body // cap

      def body_segment(t0, L, S):
        segment_y(S, t0, L)
        return new_rows(S, t0, L, None)

      if full:
        S = lax.fori_loop(0, full, lambda j, S: body_segment(j * cap, cap, S), S)
      if body % cap:
        S = body_segment(full * cap, body % cap, S)
      S = rounded(S)
      if plan.compact:
        store_state(S)

    segment_y(S, body, L, kept)
    if not plan.compact:
      def store_slot(S, i):
        pl.when(body + i < n)(lambda: store_state(S, i))
      new_rows(S, body, L, store_slot, kept if plan.fused else None)
    if plan.fused:
      arrive(store_status if plan.compact else None)

  if R:
    @pl.when(~valid)
    def _fill():
      fill = jnp.where(pad, jnp.zeros((BP,), f32), jnp.full((BP,), jnp.nan, f32))

      def fill_row(i, c):
        y_ref[b, i, xcols] = fill.astype(y_ref.dtype)
        return c

      lax.fori_loop(0, R, fill_row, 0)


def ssm(plan, params, state, prepped, args):
  """Runs the SSM launch of `plan` on `args` (`status.CallArgs`) and the conv launch's outputs
  (None when `plan.fused`); returns its outputs by name."""
  cfg = plan.cfg
  H, P = cfg.nheads, cfg.headdim
  sds = jax.ShapeDtypeStruct
  compact, fused = plan.compact, plan.fused
  i32 = jnp.int32
  prepped = prepped or {}
  if not compact:
    ring_in = (None, None)
  elif fused:
    ring_in = (state.win_xb, state.win_dt)
  else:
    ring_in = (prepped["wxb_out_ref"], prepped["wdt_out_ref"])
  return backend.pallas_call(
      lambda **refs: _ssm_kernel(**refs, plan=plan),
      inputs=dict(idx_ref=args.cache_indices, row_ref=args.state_row, n_ref=args.num_rows,
                  fold_ref=prepped.get("fold_ref"), prev_starts_ref=prepped.get("prev_starts_ref"),
                  prev_origin_ref=prepped.get("prev_origin_ref"),
                  xr_ref=prepped.get("xr_ref"), dtr_ref=prepped.get("dtr_ref"),
                  xbc_ref=args.xbc if fused else None, dt_ref=args.dt if fused else None,
                  w_ref=params.conv_weight if fused else None,
                  bias_ref=params.conv_bias if fused else None,
                  dtb_ref=params.dt_bias if fused else None,
                  conv_ref=state.conv if fused else None,
                  last_ref=state.last_xbc if fused and compact else None,
                  z_ref=args.z if plan.has_z else None, alog_ref=params.A_log, d_ref=params.D,
                  ssm_ref=state.ssm, wxb_ref=ring_in[0] if compact else None,
                  wdt_ref=ring_in[1] if compact else None,
                  pend_ref=state.pending if compact else None,
                  starts_ref=state.starts if compact else None,
                  origin_ref=state.origin if compact else None,
                  cnt_ref=jnp.zeros((plan.E, cfg.ngroups, 2), i32) if fused else None),
      outputs=dict(ssm_out_ref=sds(state.ssm.shape, plan.state_dtype),
                   pend_out_ref=sds((plan.E,), i32) if compact else None,
                   starts_out_ref=sds((plan.E,), i32) if compact else None,
                   origin_out_ref=sds((plan.E,), i32) if compact else None,
                   conv_out_ref=sds(state.conv.shape, plan.conv_dtype) if fused else None,
                   last_out_ref=(sds(state.last_xbc.shape, state.last_xbc.dtype)
                                 if fused and compact else None),
                   wxb_out_ref=(sds(state.win_xb.shape, state.win_xb.dtype)
                                if fused and compact else None),
                   wdt_out_ref=sds(state.win_dt.shape, f32) if fused and compact else None,
                   cnt_out_ref=sds((plan.E, cfg.ngroups, 2), i32) if fused else None,
                   y_ref=sds((plan.B, plan.R, cfg.d_inner), plan.y_dtype) if plan.R else None),
      aliases=dict(ssm_ref="ssm_out_ref", pend_ref="pend_out_ref",
                   starts_ref="starts_out_ref", origin_ref="origin_out_ref",
                   conv_ref="conv_out_ref", last_ref="last_out_ref", cnt_ref="cnt_out_ref",
                   **(dict(wxb_ref="wxb_out_ref", wdt_ref="wdt_out_ref") if fused else {})),
      grid=(P // plan.block_p, H, plan.B),     # one sequence's heads in turn
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages,
      interpret=plan.interpret,
      name=f"m2v_ssm_{cfg.replay_mode}_r{plan.R}")

"""The verify path's conv launch: conv and dt of a call's new rows, and the window's bookkeeping."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import status
from m2v_jax import tree
from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib

f32 = jnp.float32
BODY_TILE = 32   # body rows (R > capacity) per tile of the conv and dt programs
UNROLL_ROWS = 32  # bodies whose tiles cover at most this many rows load every row at once


def body_tiles(body: int):
  """(rows per tile, tiles) covering rows [0, body): power-of-two tiles of at most `BODY_TILE`
  rows, tile g from row min(g * rows, body - rows), so the last may overlap the one before
  (its rows recomputed to the same values)."""
  U = min(BODY_TILE, 1 << (body.bit_length() - 1))
  return U, -(-body // U)


def load_status(plan, b, idx_ref, row_ref, n_ref, pend_ref, starts_ref, parents_ok=None):
  """(safe entry, state_row or 0, num_rows, valid, `rows_to_replay`, pending, starts) of
  sequence b; not valid where `parents_ok` (a tree's, `tree_parents`) is false."""
  entry, row, n = idx_ref[b], row_ref[b], n_ref[b]
  safe = status.safe_entry(entry, plan.E)
  pending = pend_ref[safe] if plan.compact else jnp.int32(0)
  starts = starts_ref[safe] if plan.compact else jnp.int32(0)
  valid, _, n_fold = status.sequence_status(plan.compact, plan.cap, plan.E, plan.R, entry, row,
                                            n, pending, starts=starts, W=plan.cfg.window_rows)
  if plan.check_shared and plan.B > 1:
    valid = valid & ~_shared(idx_ref, b, entry, plan.B)
  if parents_ok is not None:
    valid = valid & parents_ok
  return (safe, jnp.where(valid, row, 0), jnp.clip(n, 0, plan.R), valid, n_fold, pending,
          starts)


def tree_parents(plan, par_ref, b):
  """(parents [KT] int32 of sequence b, -1 past R; whether rows 0 .. R-1 keep
  `tree.parent_ok`'s rule), from one vector load."""
  kt = lax.broadcasted_iota(jnp.int32, (plan.KT,), 0)
  par = jnp.where(kt < plan.R, par_ref[b, jnp.minimum(kt, plan.R - 1)], -1)
  ok = tree.parent_ok(par[None, :])[0] | (kt >= plan.R)
  return par, jnp.min(jnp.where(ok, 1, 0)) > 0


def at_parent(par, earlier, root):
  """The entry of `earlier` (one list of arrays per row before this one) at row `par`, or
  `root` where `par` names none of them (-1: the root), by selects (a kernel cannot index
  its registers; `tree.from_parent` is the gather that the reference uses)."""
  out = root
  for j, values in enumerate(earlier):
    out = [jnp.where(par == j, v, o) for v, o in zip(values, out)]
  return out


def _shared(idx_ref, b, entry, B):
  """Whether pool entry `entry` of sequence b is also another sequence's (one vector load)."""
  j = lax.broadcasted_iota(jnp.int32, (tiles_lib.next_pow2(B),), 0)
  ids = jnp.where(j < B, idx_ref[jnp.minimum(j, B - 1)], -1)
  return (entry >= 0) & (jnp.max(jnp.where((ids == entry) & (j != b), 1, 0)) > 0)


def _conv_kernel(*, idx_ref, row_ref, n_ref, pend_ref=None, starts_ref=None, origin_ref=None,
                 lbits_ref=None, xbc_ref=None, dt_ref=None, par_ref=None, lead_x_ref=None,
                 lead_dt_ref=None, lead_end_ref=None, lead_rb_ref=None, w_ref, bias_ref,
                 dtb_ref, alog_ref=None, conv_ref, last_ref=None, wxb_ref=None, wdt_ref=None,
                 conv_out_ref, last_out_ref=None, wxb_out_ref=None, wdt_out_ref=None, xr_ref=None,
                 dtr_ref=None, fold_ref, path_ref=None, prev_starts_ref=None,
                 prev_origin_ref=None, bits_ref=None, cum_ref=None, order_ref=None, plan):
  """Conv and dt of one sequence's new rows, grid (C / block_c + 1, B); the last program does
  dt (and a tree's ancestor bits, path decay sums and order).

  Refs (K1 = K-1, Q ring rows, XB = H*P + G*N; compact-only refs are None in snapshot mode):
    idx_ref, row_ref, n_ref           [B] int32       cache_indices, state_row, num_rows
    pend_ref, starts_ref, origin_ref  [E] int32       window bookkeeping (read only)
    lbits_ref  [E, cap] int32                         the last call's rows' ancestor bits
    xbc_ref [B, R, C], dt_ref [B, R, H]               raw new rows (None in a fold and
                                                      with `Plan.lead`)
    par_ref    [B, R] int32                           a tree's parent rows (None: a chain)
    lead_x_ref [T, C], lead_dt_ref [T, H]             a chunked prefill's flat raw rows
    lead_end_ref, lead_rb_ref [B] int32               its body's end row (the call's row 0)
                                                      and rows (`Plan.lead`; else None)
    w_ref [C, K], bias_ref [C], dtb_ref [H]           float32 params
    alog_ref   [H] f32                                A_log (a tree's; None: a chain)
    conv_ref   [E, S, C, K1] / [E, C, K1]             -> conv_out_ref (aliased)
    last_ref   [E, cap, C]                            -> last_out_ref (aliased)
    wxb_ref [E, Q, XB], wdt_ref [E, Q, H]             -> wxb_out_ref, wdt_out_ref (aliased)
    xr_ref     [B, RT, C]                             post-conv rows (zero past num_rows)
    dtr_ref    [B, RT, H] f32                         processed dt (zero past num_rows)
    fold_ref   [B] int32                              `rows_to_replay`, -1: rejected
    path_ref   [B] int32                              the folded rows' mask (`fold_path`)
    prev_starts_ref, prev_origin_ref  [B] int32       starts, origin before the call
    bits_ref   [B, KT] int32                          a tree's ancestor bits (rows past R: 0)
    cum_ref    [B, KT, H] f32                         a tree's `dual.path_decay` (past R: 0)
    order_ref  [B, KT] int32                          a snapshot tree's `tree.child_first`
  (bits_ref, cum_ref and order_ref hold nothing for a rejected sequence: no program reads
  them then.)
  """
  cfg = plan.cfg
  K1, C, H = cfg.d_conv - 1, cfg.conv_dim, cfg.nheads
  BC, cap, body, R = plan.block_c, plan.cap, plan.body, plan.R
  n_cblocks = C // BC
  n_xb_blocks = (cfg.d_inner + cfg.ngroups * cfg.dstate) // BC
  triton = not plan.interpret

  pid, b = pl.program_id(0), pl.program_id(1)
  parents, parents_ok = tree_parents(plan, par_ref, b) if plan.tree else (None, None)
  e, row, n, valid, n_fold, pending, starts = load_status(plan, b, idx_ref, row_ref, n_ref,
                                                          pend_ref, starts_ref, parents_ok)
  if plan.compact:
    origin = origin_ref[e]
    ring = lambda i: status.ring_row(cfg, origin, n_fold + i - body)
    if plan.walk:
      row_bits = jnp.where(pending > 0, lbits_ref[e, jnp.clip(row, 0, cap - 1)], 0)

  def kept(i, fn):
    pl.when((i >= body) & (i < n))(fn)

  if plan.lead:                        # row i: flat row end + i (clamped; masked past n)
    flat = lambda i: jnp.clip(lead_end_ref[b] + i, 0, lead_x_ref.shape[0] - 1)
    x_row = lambda i, cs: lead_x_ref[flat(i), cs]
    dt_row = lambda i, hs: lead_dt_ref[flat(i), hs]
  else:
    x_row = lambda i, cs: xbc_ref[b, i, cs]
    dt_row = lambda i, hs: dt_ref[b, i, hs]

  @pl.when(valid & (pid < n_cblocks))
  def _conv():
    cs = pl.ds(pid * BC, BC)
    taps = [w_ref[cs, k] for k in range(K1 + 1)]
    bias = bias_ref[cs]
    if plan.compact and plan.walk:
      # The window after row `row` of the last call: the last K-1 of [conv | its path].
      win = []
      for q, r in status.path_taps(row_bits, K1):
        old = conv_ref[e, cs, jnp.clip(q, 0, K1 - 1)].astype(f32)
        raw = last_ref[e, jnp.clip(r, 0, cap - 1), cs].astype(f32)
        win.append(jnp.where(r >= 0, raw, old))
    elif plan.compact:
      # The window after row `row` of the last call: the last K-1 of [conv | raw rows].
      off = jnp.where(pending > 0, row + 1, 0)
      win = []
      for j in range(K1):
        q = off + j
        old = conv_ref[e, cs, jnp.clip(q, 0, K1 - 1)].astype(f32)
        raw = last_ref[e, jnp.clip(q - K1, 0, cap - 1), cs].astype(f32)
        win.append(jnp.where(q < K1, old, raw))
    else:
      win = [conv_ref[e, row, cs, j].astype(f32) for j in range(K1)]
    if plan.lead:
      # After a body of rb rows: the last K1 raw rows, or (rb < K1) the window's newest ones
      # before them; rounded to the conv state's dtype, as the pool holds them.
      rb, end, T = lead_rb_ref[b], lead_end_ref[b], lead_x_ref.shape[0]
      raw = [lead_x_ref[jnp.clip(end - K1 + j, 0, T - 1), cs].astype(plan.conv_dtype
                                                                      ).astype(f32)
             for j in range(K1)]
      old = [at_parent(rb + j, [[v] for v in win[:-1]], [win[-1]])[0]   # win[rb + j]
             for j in range(K1)]
      win = [jnp.where(rb > 0, jnp.where(rb + j >= K1, r, o), w)
             for j, (r, o, w) in enumerate(zip(raw, old, win))]
    # A short body's loads (`_body_loads`) and, compiled (and in a tree), the kept rows'
    # before the barrier: one round trip (the window is read before it is overwritten);
    # interpreted, the kept rows in a fori_loop: less to compile.
    raws = [x_row(i, cs) for i in range(body, R)] if R and (triton or plan.tree) else None
    pre = _body_loads(plan, b, cs, win, xbc_ref) if body else None
    backend.barrier(plan.interpret)

    def store_conv(window, *slot):
      for j in range(K1):
        conv_out_ref[(e,) + slot + (cs, j)] = window[j].astype(plan.conv_dtype)

    if plan.compact and body == 0:
      store_conv(win)
    if not R:
      return

    def new_row(i, raw, prev):
      v = raw.astype(f32)
      out = rowmath.conv_output(taps, list(prev) + [v], bias, plan.y_dtype, triton)
      xr_ref[b, i, cs] = jnp.where(i < n, out, 0.0).astype(xr_ref.dtype)
      nxt = list(prev[1:]) + [v]
      if plan.compact:
        def store_window():
          last_out_ref[e, i - body, cs] = raw.astype(last_out_ref.dtype)

          @pl.when(pid < n_xb_blocks)
          def _():
            wxb_out_ref[e, ring(i), cs] = out.astype(wxb_out_ref.dtype)

        kept(i, store_window)
      else:
        kept(i, lambda: store_conv(nxt, i - body))
      return nxt

    if body:
      win = _conv_body(plan, b, cs, n, win, taps, bias, xbc_ref, xr_ref, pre)
      if plan.compact:
        store_conv(win)
    if plan.tree:                      # each row from its parent's window (R <= capacity)
      after = []
      for i in range(R):
        after.append(new_row(i, raws[i], at_parent(par_ref[b, i], after, win)))
    elif raws is not None:
      for i in range(body, R):
        win = new_row(i, raws[i - body], win)
    else:
      lax.fori_loop(body, R, lambda i, w: new_row(i, x_row(i, cs), w), win)
    zeros = jnp.zeros((BC,), xr_ref.dtype)
    for i in range(R, plan.RT):
      xr_ref[b, i, cs] = zeros

  @pl.when(pid == n_cblocks)
  def _dt():
    fold_ref[b] = jnp.where(valid, n_fold, -1)
    if plan.tree:
      kt = lax.broadcasted_iota(jnp.int32, (plan.KT,), 0)
      bits_ref[b, pl.ds(0, plan.KT)] = jnp.where(
          kt < R, tree.doubled_bits(parents), 0)
      if plan.ordered:
        order_ref[b, pl.ds(0, plan.KT)] = tree.child_first(parents, R)
    if plan.compact:
      prev_starts_ref[b] = starts
      prev_origin_ref[b] = origin
      if plan.walk:
        path_ref[b] = status.fold_path(pending, status.last_call_start(starts), row_bits)
    if not R:
      return
    BH = tiles_lib.pow2_divisor(H, 128)

    @pl.when(valid)
    def _():
      for hb in range(H // BH):
        hs = pl.ds(hb * BH, BH)
        bias = dtb_ref[hs]

        def row_dt(i, raw):
          dtp = rowmath.process_dt(raw.astype(f32), bias, cfg.dt_limit)
          dtp = jnp.where(i < n, dtp, 0.0)
          dtr_ref[b, i, hs] = dtp
          if plan.compact:
            def store_window():
              wdt_out_ref[e, ring(i), hs] = dtp
            kept(i, store_window)
          return dtp

        raws = [dt_row(i, hs) for i in range(body, R)] if triton else None
        if body:
          U, G = body_tiles(body)

          def load(g):
            rows = pl.ds(jnp.minimum(g * U, body - U), U)
            return rows, dt_ref[b, rows, hs]

          def tile(rows, raw):
            dtp = rowmath.process_dt(raw.astype(f32), bias[None, :], cfg.dt_limit)
            r = rows.start + lax.broadcasted_iota(jnp.int32, (U, 1), 0)
            dtr_ref[b, rows, hs] = jnp.where(r < n, dtp, 0.0)

          def step(g, c):
            tile(*load(g))
            return c

          if _short_body(body):        # the body's rows loaded at once
            for rows, raw in [load(g) for g in range(G)]:
              tile(rows, raw)
          else:
            lax.fori_loop(0, G, step, 0)
        if plan.tree:                  # path sums cum_t = cum_parent + dt_t A, as the SSM's
          A = -jnp.exp(alog_ref[hs])   # `dual.path_decay` adds them (R <= capacity)
          sums = []                    # [cum_i] of each row so far
          for i in range(R):
            dtp = row_dt(i, raws[i] if triton else dt_row(i, hs))
            above, = at_parent(par_ref[b, i], sums, [jnp.zeros((BH,), f32)])
            sums.append([above + jnp.where(i < n, dtp * A, 0.0)])
            cum_ref[b, i, hs] = sums[-1][0]
          for i in range(R, plan.KT):
            cum_ref[b, i, hs] = jnp.zeros((BH,), f32)
        elif triton:
          for i in range(body, R):
            row_dt(i, raws[i - body])
        else:
          lax.fori_loop(body, R, lambda i, c: (row_dt(i, dt_row(i, hs)), c)[1], 0)
        for i in range(R, plan.RT):
          dtr_ref[b, i, hs] = jnp.zeros((BH,), f32)


def _body_tile(plan, b, cs, win, xbc_ref, g):
  """(rows, their indices [U, 1], the K taps' input rows [U, BC] each) of body tile g of
  sequence b; rows before row 0 from `win`."""
  K1, body = len(win), plan.body
  U, _ = body_tiles(body)
  rows = pl.ds(jnp.minimum(g * U, body - U), U)
  r = rows.start + lax.broadcasted_iota(jnp.int32, (U, 1), 0)

  def tap(k):                                         # input row r - K1 + k
    src = r - K1 + k
    v = xbc_ref[b, jnp.maximum(src[:, 0], 0), cs].astype(f32)
    for j in range(K1):
      v = jnp.where(src == j - K1, win[j][None, :], v)
    return v

  return rows, r, [tap(k) for k in range(K1 + 1)]     # every load before the arithmetic


def _body_end(plan, b, cs, win, xbc_ref):
  """The window after the body: its last K-1 raw rows (float32), from `win` where the body
  is shorter."""
  K1, body = len(win), plan.body
  return [xbc_ref[b, body - K1 + j, cs].astype(f32) if body - K1 + j >= 0 else win[body + j]
          for j in range(K1)]


def _short_body(body: int) -> bool:
  """Whether the body's tiles cover at most `UNROLL_ROWS` rows (loaded at once)."""
  U, G = body_tiles(body)
  return U * G <= UNROLL_ROWS


def _body_loads(plan, b, cs, win, xbc_ref):
  """Every input row of a short body (`_short_body`) and the window after it, as
  `_conv_body` takes them (loaded at once, before the barrier, in the kept rows' round
  trip); None for a longer body (its tiles then load in a loop)."""
  if not _short_body(plan.body):
    return None
  _, G = body_tiles(plan.body)
  return ([_body_tile(plan, b, cs, win, xbc_ref, g) for g in range(G)],
          _body_end(plan, b, cs, win, xbc_ref))


def _conv_body(plan, b, cs, n, win, taps, bias, xbc_ref, xr_ref, loads=None):
  """Post-conv rows [0, body) of sequence b in tiles of rows (no chain from row to row), taps
  before row 0 from `win`, or from `loads` (`_body_loads`); returns the window after them
  (the last K-1 raw rows, float32)."""
  taps2, bias2 = [t[None, :] for t in taps], bias[None, :]

  def finish(rows, r, window):
    out = rowmath.conv_output(taps2, window, bias2, plan.y_dtype, not plan.interpret)
    xr_ref[b, rows, cs] = jnp.where(r < n, out, 0.0).astype(xr_ref.dtype)

  if loads is not None:
    tiles, end = loads
    for tile in tiles:
      finish(*tile)
    return end

  def step(g, c):
    finish(*_body_tile(plan, b, cs, win, xbc_ref, g))
    return c

  _, G = body_tiles(plan.body)
  lax.fori_loop(0, G, step, 0)
  return _body_end(plan, b, cs, win, xbc_ref)


def conv(plan, params, state, args, parents=None, lead=None):
  """Runs the conv launch of `plan` on `args` (`status.CallArgs`), with a tree's `parents`
  [B, R] where `plan.tree` (a sequence whose parents break `tree.parent_ok`'s rule is
  rejected) and `lead` (`verify.Lead`: the flat rows the call's rows are read from, each
  sequence's body end row and body rows) where `plan.lead`; returns its outputs by name."""
  cfg = plan.cfg
  C, H = cfg.conv_dim, cfg.nheads
  sds = jax.ShapeDtypeStruct
  compact, B = plan.compact, plan.B
  i32 = jnp.int32
  return backend.pallas_call(
      lambda **refs: _conv_kernel(**refs, plan=plan),
      inputs=dict(idx_ref=args.cache_indices, row_ref=args.state_row, n_ref=args.num_rows,
                  pend_ref=state.pending if compact else None,
                  starts_ref=state.starts if compact else None,
                  origin_ref=state.origin if compact else None,
                  lbits_ref=state.last_bits if plan.walk else None,
                  xbc_ref=args.xbc if plan.R and not plan.lead else None,
                  dt_ref=args.dt if plan.R and not plan.lead else None,
                  par_ref=parents if plan.tree else None,
                  lead_x_ref=lead.xbc if plan.lead else None,
                  lead_dt_ref=lead.dt if plan.lead else None,
                  lead_end_ref=lead.end if plan.lead else None,
                  lead_rb_ref=lead.body if plan.lead else None,
                  w_ref=params.conv_weight,
                  bias_ref=params.conv_bias, dtb_ref=params.dt_bias,
                  alog_ref=params.A_log if plan.tree else None,
                  conv_ref=state.conv, last_ref=state.last_xbc if compact else None,
                  wxb_ref=state.win_xb if compact else None,
                  wdt_ref=state.win_dt if compact else None),
      outputs=dict(conv_out_ref=sds(state.conv.shape, plan.conv_dtype),
                   last_out_ref=sds(state.last_xbc.shape, state.last_xbc.dtype) if compact else None,
                   wxb_out_ref=sds(state.win_xb.shape, state.win_xb.dtype) if compact else None,
                   wdt_out_ref=sds(state.win_dt.shape, f32) if compact else None,
                   xr_ref=sds((B, plan.RT, C), plan.y_dtype) if plan.R else None,
                   dtr_ref=sds((B, plan.RT, H), f32) if plan.R else None,
                   fold_ref=sds((B,), i32),
                   path_ref=sds((B,), i32) if plan.walk else None,
                   prev_starts_ref=sds((B,), i32) if compact else None,
                   prev_origin_ref=sds((B,), i32) if compact else None,
                   bits_ref=sds((B, plan.KT), i32) if plan.tree else None,
                   cum_ref=sds((B, plan.KT, H), f32) if plan.tree else None,
                   order_ref=sds((B, plan.KT), i32) if plan.ordered else None),
      aliases=dict(conv_ref="conv_out_ref", last_ref="last_out_ref", wxb_ref="wxb_out_ref",
                   wdt_ref="wdt_out_ref"),
      grid=(C // plan.block_c + 1, B),
      num_warps=plan.tiles.prep_warps, num_stages=1, interpret=plan.interpret,
      name=f"m2v_conv_{cfg.replay_mode}_r{plan.R}")

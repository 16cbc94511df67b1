"""The verify path's SSM launch: the compact fold, y in the SSD dual form, the states."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import status
from m2v_jax.kernels import backend
from m2v_jax.kernels import dual
from m2v_jax.kernels import rowmath

f32 = jnp.float32


def chain_bits(k: int) -> int:
  """`status.chain_bits` of row k as a Python int32 (row 31: all 32 bits)."""
  return int(np.uint32((1 << (k + 1)) - 1).view(np.int32))


def _ssm_kernel(*, idx_ref, row_ref, n_ref, fold_ref, path_ref=None, prev_starts_ref=None,
                prev_origin_ref=None, xr_ref=None, dtr_ref=None, z_ref=None, par_ref=None,
                bits_ref=None, cum_ref=None, order_ref=None, alog_ref, d_ref,
                ssm_ref, wxb_ref=None, wdt_ref=None, pend_ref=None, starts_ref=None,
                origin_ref=None, lbits_ref=None, yin_ref=None, yrow_ref=None, ycount_ref=None,
                ssm_out_ref, pend_out_ref=None, starts_out_ref=None, origin_out_ref=None,
                lbits_out_ref=None, y_ref=None, plan):
  """Fold, y and states of one head's [block_p, N] state tile, grid (P / block_p, H, B).

  Refs (Q ring rows, XB = H*P + G*N; compact-only refs are None in snapshot mode):
    idx_ref, row_ref, n_ref           [B] int32       cache_indices, state_row, num_rows
    fold_ref                          [B] int32       `rows_to_replay`, -1: rejected
    path_ref                          [B] int32       the folded rows' mask (`fold_path`)
    prev_starts_ref, prev_origin_ref  [B] int32       starts, origin before the call
    xr_ref [B, RT, C], dtr_ref [B, RT, H] f32         post-conv rows, processed dt
    z_ref [B, R, H*P]; [T, H*P] with `Plan.lead`      optional gate
    par_ref [B, R], bits_ref [B, KT] int32            a tree's parent rows, ancestor bits
    cum_ref    [B, KT, H] f32                         a tree's `dual.path_decay` sums
    order_ref  [B, KT] int32                          a snapshot tree's row order
    alog_ref, d_ref                   [H] f32
    ssm_ref    [E, S, H, P, N] / [E, H, P, N]         -> ssm_out_ref (aliased)
    wxb_ref [E, Q, XB], wdt_ref [E, Q, H]             the ring
    pend_ref, starts_ref, origin_ref  [E] int32       -> *_out_ref (aliased)
    lbits_ref  [E, cap] int32                         -> lbits_out_ref (aliased), `last_bits`
    yin_ref    [T, H*P]                               -> y_ref (aliased), `Plan.lead`:
    yrow_ref, ycount_ref [B] int32                    y's first row and rows a sequence
    y_ref      [B, R, H*P]; [T, H*P] with `Plan.lead`  (None in a fold)
  """
  cfg, R, body, cap, KT = plan.cfg, plan.R, plan.body, plan.cap, plan.KT
  assert not (plan.tree and body), "a tree call has at most capacity rows"
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
  e = status.safe_entry(entry, plan.E)
  n_fold = fold_ref[b]
  valid, pad, n_fold = n_fold >= 0, entry == -1, jnp.maximum(n_fold, 0)
  n = jnp.clip(n_ref[b], 0, R)
  g = h // cfg.heads_per_group
  A, D = -jnp.exp(alog_ref[h]), d_ref[h]
  ps = pl.ds(pid_p * BP, BP)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  bcols = [pl.ds(HP + g * N + c.start, NC) for c in chunks]
  kt = lax.broadcasted_iota(jnp.int32, (KT,), 0)
  if plan.lead:                        # y and z: the prefill's flat rows, `ycount` of them
    y0, ycount, T = yrow_ref[b], ycount_ref[b], y_ref.shape[0]
    y_at = lambda t, K=None: (jnp.minimum(y0 + t, T - 1) if K is None else pl.ds(y0 + t, K),
                              xcols)
  else:
    y_at = lambda t, K=None: (b, t if K is None else pl.ds(t, K), xcols)

  def row(src_ref, dt_ref, *at):
    """One row's x [BP, 1], B chunks [1, NC] (float32) and processed dt."""
    lead, r = at[:-1], at[-1]
    x = src_ref[lead + (r, xcols)].astype(f32)[:, None]
    bm = [src_ref[lead + (pl.ds(r, 1), c)].astype(f32) for c in bcols]
    return x, bm, dt_ref[lead + (r, h)]

  def update(S, x, bm, dtv):
    dtx = dtv * x
    da = jnp.exp(dtv * A)
    return [rowmath.state_update(s, da, dtx, bc, fma) for s, bc in zip(S, bm)]

  def rounded(S):                      # as a store then a load would give it
    return [rowmath.stored(s, plan.state_dtype, triton) for s in S]

  def store_state(S, *slot):
    for c, s in zip(chunks, S):
      ssm_out_ref[(e,) + slot + (h, ps, c)] = s.astype(ssm_out_ref.dtype)

  def segment_tiles(t0, L, K=KT):
    """x [K, BP], B and C chunks [K, NC], dt [K] of rows t0.., and L scalar dts (none in a
    tree: its decays come from the conv launch's path sums)."""
    rows = (b, pl.ds(t0, K))
    x = xr_ref[rows + (xcols,)].astype(f32)
    bm = [xr_ref[rows + (c,)].astype(f32) for c in bcols]
    cm = [xr_ref[rows + (pl.ds(HP + GN + g * N + c.start, NC),)].astype(f32) for c in chunks]
    dtv = dtr_ref[rows + (h,)]
    return x, bm, cm, dtv, [dtr_ref[b, t0 + k, h] for k in range(0 if plan.tree else L)]

  def skips(lo):                       # whether a segment leaves out rows before `lo`
    return not (isinstance(lo, int) and lo == 0)

  def segment_live(t0, L, K, lo=0):
    """[K] bool: the tile's rows from `lo` that are among the segment's L and before
    num_rows."""
    ks = kt if K == KT else lax.broadcasted_iota(jnp.int32, (K,), 0)
    live = (ks < L) & (t0 + ks < n)
    return live & (ks >= lo) if skips(lo) else live

  def segment_cum(t0, dts, K, lo=0):
    """[K]: `dual.log_decay` of the segment's dt·A (0 before row `lo` and past num_rows)."""
    def on(k):
      return (t0 + k < n) & (k >= lo) if skips(lo) else t0 + k < n
    return dual.log_decay([jnp.where(on(k), d * A, 0.0) for k, d in enumerate(dts)], K)

  def segment_y(S, t0, L, tiles=None, held=f32, whole=False, lo=0):
    """Stores y of rows t0..t0+L-1 from start state S (exact in `held`); 0 past num_rows, gated.
    `whole`: the tiles' K rows are the segment's L (a full body segment). y is stored as one
    tile where the tile's rows lie within the call (rows past the segment's L masked off),
    else row by row. With `lo` (`whole` only), rows before t0 + lo are left out (neither run
    nor stored)."""
    if skips(lo) and not whole:
      raise ValueError("segment_y: `lo` needs a whole segment's tile store")
    x, bm, cm, dtv, dts = tiles or segment_tiles(t0, L)
    K, live = x.shape[0], segment_live(t0, L, x.shape[0], lo)
    if plan.tree:                      # t0 == 0: the conv launch's path sums
      anc, cum = dual.ancestors(bits_ref[b, pl.ds(0, KT)], KT), cum_ref[b, pl.ds(0, KT), h]
    else:
      anc, cum = None, segment_cum(t0, dts, K, lo)
    y = dual.outputs(S, x, bm, cm, dtv, A, D, live, mm, cum, held, anc=anc)  # [BP, K]
    if whole or (isinstance(t0, int) and t0 + K <= R):
      at = y_at(t0, K)
      ks = lax.broadcasted_iota(jnp.int32, (K, 1), 0)
      mask = (ks >= lo) & (ks < L) if skips(lo) else ks < L
      if plan.lead:                    # the rows past ycount are another sequence's
        mask = mask & (t0 + ks < ycount)
      yt = y.T                                                            # [K, BP]
      if plan.has_z:
        zt = backend.load(z_ref.at[at], mask) if plan.lead else z_ref[at]
        yt = rowmath.gate(yt, zt.astype(f32))
      yt = jnp.where(live[:, None], yt, 0.0).astype(y_ref.dtype)
      if L == K and not skips(lo) and not plan.lead:
        y_ref[at] = yt
      else:   # the tile's rows past L belong to the next segment, before lo to the last one
        backend.store(y_ref.at[at], yt, mask)
      return
    cols = lax.broadcasted_iota(jnp.int32, (BP, K), 1)

    def store_row(t):
      yt = jnp.sum(jnp.where(cols == t, y, 0.0), axis=1)
      if plan.has_z:
        yt = rowmath.gate(yt, z_ref[y_at(t0 + t)].astype(f32))
      yt = jnp.where(t0 + t < n, yt, 0.0).astype(y_ref.dtype)
      if plan.lead:
        pl.when(t0 + t < ycount)(lambda: _store(y_ref, y_at(t0 + t), yt))
      else:
        y_ref[b, t0 + t, xcols] = yt

    backend.static_loop(L, store_row, plan.interpret)

  def fold_segment(S, t0, L, tiles, lo=0):
    """The state after rows t0 + lo .. t0 + L - 1 (those before num_rows) from S in one product
    (the SSD dual form): exp(c) S + sum_k dt_k exp(c - cum_k) x_k B_kᵀ, with cum the
    running sum of dt·A over the rows (`dual.log_decay`) and c its last entry."""
    x, bm, _, dtv, dts = tiles
    K = x.shape[0]
    live, cum = segment_live(t0, L, K, lo), segment_cum(t0, dts, K, lo)
    c = jnp.sum(jnp.where(lax.broadcasted_iota(jnp.int32, (K,), 0) == L - 1, cum, 0.0))
    w = jnp.where(live, dtv * jnp.exp(c - cum), 0.0)                    # [K]
    xw = jnp.where(live[:, None], x, 0.0) * w[:, None]                  # [K, BP]
    bk = [jnp.where(live[:, None], v, 0.0) for v in bm]                 # [K, NC]
    decay = jnp.exp(c)
    return [decay * s + mm.product(xw, v, "a", trans_a=True) for s, v in zip(S, bk)]

  def walk(S, steps, first, next_row, load, again=None, prev=None):
    """S after `steps` rows from `first` = (row, rest), `next_row(rest)` -> (row, rest), each
    row `load(row)`ed one update ahead; rounded first where `again(row, previous row)`, the
    row before the first `prev` (default: first - 1)."""
    def fold_row(_, carry):
      S, j, rest, ahead = carry[:4]
      if again is not None:
        S = lax.cond(again(j, carry[4]), rounded, lambda s: s, S)
      j_next, rest = next_row(rest)
      loaded = load(j_next)            # issued before this row's update
      return (update(S, *ahead), j_next, rest, loaded) + ((j,) if again is not None else ())

    j0, rest0 = first
    before = j0 - 1 if prev is None else prev
    carry = (S, j0, rest0, load(j0)) + ((before,) if again is not None else ())
    return lax.fori_loop(0, steps, fold_row, carry)[0]

  def lowest(rest):                    # (the lowest row of mask `rest` (0 if none), the others)
    return jnp.maximum(31 - lax.clz(rest & -rest), 0), rest & (rest - 1)

  def new_rows(S, t0, L, store, keep_start=False):
    """The state after rows t0 .. t0 + L - 1, `store(S, i)` after each; loads one row ahead.
    A tree's rows run in `order_ref`'s order where `plan.ordered`, else in row order. A tree
    row whose parent is not the row run before starts from the parent's state, rounded as
    the slot would hold it: refolded along the parent's path from the start state S or, with
    `tree_cache`, from the last refolded parent where that is this parent or one of its
    ancestors (at most `tree_recompute` rows walked; more reload the parent's slot). A row
    whose parent ran just before carries on from the unrounded S, rounded first (a 16-bit
    state) where the parent is not the row before it, as its slot would hold it. Unless
    `keep_start` (S is needed after), a tree's root row runs first, outside the loop, and
    refolds start from its unrounded state instead of S (every path begins at the root)."""
    S0 = S
    depth, cache = plan.tiles.tree_recompute, plan.tree and bool(plan.tiles.tree_cache)
    again = (lambda j, j_prev: j > j_prev + 1) if plan.state_dtype != f32 else None
    order = plan.ordered
    peel = plan.tree and not keep_start         # row 0, the root, runs first in either order

    def ahead(k):                      # the row run at step k (the last one past L)
      k = jnp.minimum(k, L - 1)
      return row(xr_ref, dtr_ref, b, t0 + (order_ref[b, k] if order else k))

    def from_parent(i, prev_row, S, memo):      # t0 == 0 in a tree (no body)
      """(Row i's start state, the memo: the last refolded parent's unrounded state, row),
      after row `prev_row`."""
      par = par_ref[b, t0 + i]
      slot = jnp.clip(par, 0, R - 1)
      path = bits_ref[b, slot]
      root = jnp.int32(0 if peel else -1)       # the last row S0 holds
      rest, prev, near = path & ~1 if peel else path, root, False
      if cache:
        c = memo[1]
        near = (c >= 0) & (((path >> jnp.maximum(c, 0)) & 1) > 0)
        rest = jnp.where(near, path & ~bits_ref[b, jnp.maximum(c, 0)], rest)
        prev = jnp.where(near, c, root)
      steps = lax.population_count(rest)

      def refold():
        start = lax.cond(near, lambda: memo[0], lambda: S0) if cache else S0
        S_par = walk(start, steps, lowest(rest), lowest, lambda j: row(xr_ref, dtr_ref, b, j),
                     again, prev)
        return rounded(S_par), ((S_par, slot) if cache else memo)

      def reload():
        # The slot's stores happen before its reload in every thread, whatever the layouts.
        backend.barrier(plan.interpret)
        return [ssm_out_ref[(e, slot) + (h, ps, c)].astype(f32) for c in chunks], memo

      def from_slot():
        if depth >= R - 1 - peel:      # every parent's path fits
          return refold()
        if depth == 0:
          return reload()
        return lax.cond(steps <= depth, refold, reload)

      def carry_on():                  # the parent just ran: its state is S, unrounded
        if order and again is not None:  # a slot rounds where the path skips rows
          return lax.cond(par != i - 1, rounded, lambda s: s, S), memo
        return S, memo

      return lax.cond((par >= 0) & (par != prev_row), from_slot, carry_on)

    def step(k, carry):
      S, cur, memo = carry[:3]
      i = order_ref[b, k] if order else k
      loaded = ahead(k + 1)
      if plan.tree:
        S, memo = from_parent(i, carry[3] if order else t0 + i - 1, S, memo)
      S = update(S, *cur)
      if store:
        store(S, i)
      return (S, loaded, memo) + ((i,) if order else ())

    k0 = int(peel)
    cur = ahead(0)
    if peel:
      nxt = ahead(1)                   # issued before the root's update, as in the loop
      S = update(S, *cur)
      if store:
        store(S, 0)
      S0, cur = S, nxt
    memo = (S0, jnp.int32(-1)) if cache else ()
    first = (jnp.int32(k0 - 1),) if order else ()
    return lax.fori_loop(k0, L, step, (S, cur, memo) + first)[0]

  @pl.when(valid)
  def _run():
    L = min(R, cap)
    # The kept segment's rows do not depend on the state: their loads go out first.
    # `tree_y_after`: a snapshot tree's y after its rows, so its tiles are loaded then.
    y_after = plan.tree and not plan.compact and bool(plan.tiles.tree_y_after)
    kept = segment_tiles(body, L) if R and not body and not y_after else None
    slot = () if plan.compact else (row_ref[b],)
    S = [ssm_ref[(e,) + slot + (h, ps, c)].astype(f32) for c in chunks]
    if plan.compact:
      starts, origin = prev_starts_ref[b], prev_origin_ref[b]
      if plan.walk:                    # the path's rows, lowest first
        path = path_ref[b]
        steps, next_row = lax.population_count(path), lowest
        first_row = lowest(path)
      else:                            # pending rows 0 .. n_fold - 1
        path, steps, last = None, n_fold, jnp.maximum(n_fold - 1, 0)

        def next_row(r):               # (row r, clamped to the last folded row; r + 1)
          return jnp.minimum(r, last), r + 1
        first_row = next_row(jnp.int32(0))

      def ring(j):
        return row(wxb_ref, wdt_ref, e, status.ring_row(cfg, origin, j))

      # A 16-bit state rounds before a row that began a later call (deferred commit) and
      # before a tree row whose parent is not the row before it (snapshot mode starts such a
      # row from the parent's stored state).
      again = None
      if plan.state_dtype != f32 and (cfg.deferred or plan.walk):
        def again(j, j_prev):
          gap = (j > j_prev + 1) if plan.walk else False
          if cfg.deferred:
            gap = gap | ((((starts >> j) & 1) > 0) & (j > 0))
          return gap

      S = rounded(walk(S, steps, first_row, next_row, ring, again))
      flush = status.flushes(cfg, R, n_fold, n, path=path)
      if not body:
        pl.when((n_fold > 0) & flush)(lambda: store_state(S))

      @pl.when((pid_p == 0) & (h == 0))
      def _():
        _, new_pending, new_starts = status.window_after(cfg, R, n_fold, n, starts, flush)
        pend_out_ref[e] = new_pending
        starts_out_ref[e] = new_starts
        origin_out_ref[e] = status.ring_origin(cfg, origin, n_fold, flush)
        if plan.walk:                  # the kept rows' ancestor bits
          for i in range(body, R):
            bits_i = bits_ref[b, i] if plan.tree else chain_bits(i - body)
            pl.when(i < n)(lambda i=i, v=bits_i: _store(lbits_out_ref, (e, i - body), v))
    if not R:
      return

    if body:
      folded = bool(plan.tiles.body_rows)  # each segment folded in one product
      seg = plan.KB                    # rows a body segment
      tk = seg if folded else KT       # rows of its tiles
      full, rem = divmod(body, seg)

      def body_segment(t0, L, S, lo=0):
        tiles = segment_tiles(t0, L, tk)
        segment_y(S, t0, L, tiles, whole=folded and L == seg, lo=lo)
        return fold_segment(S, t0, L, tiles, lo) if folded else new_rows(S, t0, L, None)

      if folded and full + (rem > 0) == 1:
        # One segment, in a loop of one trip whose count the compiler cannot fold: compiled
        # straight on, it takes 255 registers at B=1 R=37 and 1.4x the instructions (190).
        once = 1 + jnp.minimum(pid_p, 0)
        S = lax.fori_loop(0, once, lambda _, S: body_segment(0, seg if full else rem, S), S)
      elif folded and full and rem:
        # One loop of whole segments; the last one ends at the body's end and runs only its
        # last `rem` rows (one copy of the segment code: a partial copy beside the loop took
        # up to 1.4x the call's time, BENCHMARKS.md "Session 40").
        def overlapped(j, S):
          t0 = jnp.minimum(j * seg, body - seg)
          return body_segment(t0, seg, S, lo=j * seg - t0)
        S = lax.fori_loop(0, full + 1, overlapped, S)
      else:
        # Whole segments; a partial one (only unfolded, body_rows=0) runs last, or first where,
        # run last, its tiles would pass row R.
        lead = rem if full * seg + tk > R else 0
        if lead:
          S = body_segment(0, lead, S)
        if full:
          S = lax.fori_loop(0, full, lambda j, S: body_segment(lead + j * seg, seg, S), S)
        if rem and not lead:
          S = body_segment(full * seg, rem, S)
      S = rounded(S)
      if plan.compact:
        store_state(S)

    if not y_after:
      segment_y(S, body, L, kept, plan.state_dtype)
    if not plan.compact:
      def store_slot(S, i):
        pl.when(body + i < n)(lambda: store_state(S, i))
      new_rows(S, body, L, store_slot, keep_start=y_after)
    if y_after:                        # from the start state S, which new_rows leaves as it is
      segment_y(S, body, L, None, plan.state_dtype)

  if R:
    @pl.when(~valid)
    def _fill():
      fill = jnp.where(pad, jnp.zeros((BP,), f32), jnp.full((BP,), jnp.nan, f32))

      def fill_row(i, c):
        _store(y_ref, y_at(i), fill.astype(y_ref.dtype))
        return c

      lax.fori_loop(0, jnp.minimum(ycount, R) if plan.lead else R, fill_row, 0)


def _store(ref, at, value):
  ref[at] = value


def ssm(plan, params, state, prepped, args, parents=None, lead=None):
  """Runs the SSM launch of `plan` on `args` (`status.CallArgs`) and the conv launch's outputs
  (a tree's ancestor bits, path decay sums and row order among them), with a tree's parents
  [B, R] where `plan.tree` and a prefill tail's `verify.Lead` where `plan.lead` (y written
  into `lead.y`); returns its outputs by name."""
  cfg = plan.cfg
  H, P = cfg.nheads, cfg.headdim
  sds = jax.ShapeDtypeStruct
  compact = plan.compact
  i32 = jnp.int32
  return backend.pallas_call(
      lambda **refs: _ssm_kernel(**refs, plan=plan),
      inputs=dict(idx_ref=args.cache_indices, row_ref=args.state_row, n_ref=args.num_rows,
                  fold_ref=prepped["fold_ref"], path_ref=prepped.get("path_ref"),
                  prev_starts_ref=prepped.get("prev_starts_ref"),
                  prev_origin_ref=prepped.get("prev_origin_ref"),
                  xr_ref=prepped.get("xr_ref"), dtr_ref=prepped.get("dtr_ref"),
                  z_ref=(lead.z if plan.lead else args.z) if plan.has_z else None,
                  par_ref=parents,
                  bits_ref=prepped.get("bits_ref"), cum_ref=prepped.get("cum_ref"),
                  order_ref=prepped.get("order_ref"),
                  alog_ref=params.A_log, d_ref=params.D,
                  ssm_ref=state.ssm, wxb_ref=prepped.get("wxb_out_ref"),
                  wdt_ref=prepped.get("wdt_out_ref"),
                  pend_ref=state.pending if compact else None,
                  starts_ref=state.starts if compact else None,
                  origin_ref=state.origin if compact else None,
                  lbits_ref=state.last_bits if plan.walk else None,
                  yin_ref=lead.y if plan.lead else None,
                  yrow_ref=lead.end if plan.lead else None,
                  ycount_ref=lead.count if plan.lead else None),
      outputs=dict(ssm_out_ref=sds(state.ssm.shape, plan.state_dtype),
                   pend_out_ref=sds((plan.E,), i32) if compact else None,
                   starts_out_ref=sds((plan.E,), i32) if compact else None,
                   origin_out_ref=sds((plan.E,), i32) if compact else None,
                   lbits_out_ref=sds(state.last_bits.shape, i32) if plan.walk else None,
                   y_ref=(sds(lead.y.shape, plan.y_dtype) if plan.lead else
                          sds((plan.B, plan.R, cfg.d_inner), plan.y_dtype) if plan.R else None)),
      aliases=dict(ssm_ref="ssm_out_ref", pend_ref="pend_out_ref",
                   starts_ref="starts_out_ref", origin_ref="origin_out_ref",
                   lbits_ref="lbits_out_ref", **(dict(yin_ref="y_ref") if plan.lead else {})),
      grid=(P // plan.block_p, H, plan.B),     # one sequence's heads in turn
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages,
      interpret=plan.interpret,
      name=f"m2v_ssm_{cfg.replay_mode}_r{plan.R}")

"""Serial (row-by-row) Pallas kernels of both replay modes: the verify path.

A call runs two kernels on the Triton lowering:

1. `prep` (grid: conv-channel blocks + 1, batch). Each program owns a block of conv channels
   of one sequence: it reads the starting conv state, replays pending window rows (compact),
   runs the new rows through the causal conv, writes the conv snapshots (snapshot mode) or
   the new base conv state and window rows (compact mode) in place, and writes the post-conv
   activations of every row it ran to a float32 scratch `xr [B, RT, C]`. The extra program
   per sequence processes dt (bias, softplus, clamp, decay) into `dtr`, `dar [B, RT, H]`,
   updates the window's dt rows, and writes the sequence's status to `info [B]` (the number
   of rows to replay, or -1 if the call rejects the sequence). Ownership is disjoint, and
   each program reads what it owns before writing it, so the in-place updates have no races.
2. `ssm` (grid: P / block_p, batch, heads). Each program owns a [block_p, N] float32 tile of
   one head's state, kept in registers as N / n_cols tiles [block_p, n_cols] (a thread holds
   the n of one p, so the y readout reduces across n_cols / 4 lanes only): it loads it once,
   replays the pending rows (compact), runs the new rows (state update and y readout), and
   stores the tile as the snapshot of every row (snapshot mode) or once as the new base
   (compact mode). Unrolled calls collect y in a [block_p, R] tile stored once. It reads the
   status from `info`, so it can also update the compact `pending` counts in place (prep
   reads them).

Verify-sized calls unroll their row loops and issue each row's loads ahead of the stores of
earlier rows (`_Lookahead`: all rows up front in prep, `tiles.prefetch` rows ahead in the SSM
kernel, where every prefetched B/C row costs registers): the compiler cannot move a load above
a store to memory that might alias, so a load-compute-store loop pays one memory latency per
row.

Rows are indexed in the scratch as `RT = R` (snapshot) or `RT = W + R` (compact: replayed
window rows at 0..W-1, new rows at W..W+R-1).

Both modes run the same kernel functions with a different static `Plan`, call `rowmath` for
every arithmetic step (with the compiled kernels' fused multiply-add, `backend.fma`), and use
the same (block_p, num_warps, n_cols), so their y and states agree bitwise. Invalid
sequences (bad `state_row`, entry, or `num_rows`, checked on the device) run nothing: their
state is untouched and their y rows are NaN; padding entries (-1) get y = 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import config as config_lib
from m2v_jax import status
from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one launch pair.

  Attributes:
    cfg: layer geometry (its `replay_mode` is the mode).
    R: new rows in the call; 0 = fold only (compact: replay the window into the base).
    E: entries in the state pool.
    B: sequences in the call.
    has_z: whether a gate z is applied to y.
    y_dtype: dtype of y (the activation dtype).
    conv_dtype: dtype of the conv state.
    state_dtype: storage dtype of the SSM state (float32, or 16-bit: `m2v_jax.state`).
    tiles: launch parameters.
    interpret: Pallas interpret mode.
  """

  cfg: config_lib.Mamba2Config
  R: int
  E: int
  B: int
  has_z: bool
  y_dtype: jnp.dtype
  conv_dtype: jnp.dtype
  tiles: tiles_lib.TileConfig
  interpret: bool
  state_dtype: jnp.dtype = jnp.dtype(jnp.float32)

  @property
  def compact(self) -> bool:
    return self.cfg.compact

  @property
  def cap(self) -> int:
    return self.cfg.capacity

  @property
  def first_kept(self) -> int:
    """Snapshot: rows before the first one whose state is stored (R > S keeps the last S)."""
    return max(self.R - self.cap, 0)

  @property
  def commit(self) -> int:
    """Compact: new rows folded into the base (R > capacity leaves the last capacity rows
    pending)."""
    return max(self.R - self.cap, 0)

  @property
  def W(self) -> int:
    """Compact: rows of the window (`cfg.window_rows`)."""
    return self.cfg.window_rows

  @property
  def new_off(self) -> int:
    return self.W if self.compact else 0

  @property
  def RT(self) -> int:
    return self.new_off + self.R

  @property
  def block_c(self) -> int:
    """Conv channels per prep program: the tile's block_c, shrunk to divide C."""
    return tiles_lib.pow2_divisor(self.cfg.conv_dim, self.tiles.block_c)

  @property
  def block_p(self) -> int:
    """P rows per SSM program: the tile's block_p, shrunk to divide P."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def n_cols(self) -> int:
    """The SSM tile's n_cols, at most N."""
    return min(self.tiles.n_cols, self.cfg.dstate)

  @property
  def unroll_new(self) -> bool:
    """Unroll the new-row loop (verify-sized calls) instead of a `fori_loop` (prefill)."""
    return self.tiles.unroll and self.R <= self.cap

  @property
  def unroll_replay(self) -> bool:
    return self.tiles.unroll and self.W <= MAX_UNROLL


MAX_UNROLL = 16


class _Lookahead:
  """Issues the loads of unrolled rows ahead of their use, in program order.

  Rows register their load thunks in use order (across phases: replay rows, then new rows);
  `take(k)` emits every load up to row k + depth before returning row k's inputs, so loads
  run `depth` rows ahead of the compute and the stores that follow it. depth=None issues all
  loads at the first `take` (most memory-level parallelism, most registers).
  """

  def __init__(self, depth):
    self.depth, self.thunks, self.values = depth, [], []

  def register(self, thunks):
    base = len(self.thunks)
    self.thunks += thunks
    return list(range(base, base + len(thunks)))

  def take(self, k):
    limit = len(self.thunks) if self.depth is None else min(len(self.thunks), k + self.depth + 1)
    while len(self.values) < limit:
      self.values.append(self.thunks[len(self.values)]())
    return self.values[k]


def _prefetch(start, stop, load, unroll, ahead):
  """Registers rows [start, stop) with `ahead` (unrolled) and returns their handles, or
  None (a `fori_loop` that loads each row in the loop)."""
  if not unroll:
    return None
  return ahead, ahead.register([lambda i=i: load(i) for i in range(start, stop)])


def _rows(start, stop, bound, load, body, carry, pre):
  """Runs `body(i, inputs, carry, active)` over rows i in [start, stop) below `bound`.

  With `pre` (from `_prefetch`) every row of [start, stop) is emitted, unrolled, with
  `active = i < bound` (traced): the body guards its side effects with `_when`. Without, a
  `fori_loop` over [start, bound) that loads each row's inputs in the loop, with
  `active = None` (always active).

  Carries: `active` only falls (i < bound), so once a row is inactive every later row is too.
  The new rows of a verify-sized call (unrolled only when R <= capacity, so no unguarded
  commit store) return their carry unselected: an inactive row's carry reaches only guarded
  stores (skipped) and unguarded outputs that are never consumed (scratch `xr` rows of
  inactive rows, y rows replaced by 0). A carry that outlives the loop (the replayed rows,
  which become the base) is selected with `_sel` or branched with `_if`.
  """
  if pre is not None:
    ahead, handles = pre
    for i, k in zip(range(start, stop), handles):
      carry = body(i, ahead.take(k), carry, i < bound)
    return carry
  return lax.fori_loop(start, bound, lambda i, c: body(i, load(i), c, None), carry)


def _when(active, fn):
  if active is None:
    fn()
  else:
    pl.when(active)(fn)


def _kept(i, first, active, fn):
  """Runs the store `fn` of row i if the row is kept (i >= first: R > capacity keeps only the
  last rows; `first` is static) and active."""
  if first:
    pl.when(i >= first)(fn)
  else:
    _when(active, fn)


def _if(active, fn, carry):
  """fn(carry) where `active` (a traced scalar; None = always), else carry, as a branch."""
  if active is None:
    return fn(carry)
  return lax.cond(active, fn, lambda c: c, carry)


def _sel(active, new, old):
  if active is None:
    return new
  return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, old)


def _load_status(plan, b, idx_ref, row_ref, n_ref, pend_ref, starts_ref):
  """(safe entry, state_row (0 if rejected), num_rows, valid, padding, rows to replay,
  `starts` bitmask) of sequence b, by `status.sequence_status`."""
  entry, row, n = idx_ref[b], row_ref[b], n_ref[b]
  safe = status.safe_entry(entry, plan.E)
  pending = pend_ref[safe] if plan.compact else jnp.int32(0)
  starts = starts_ref[safe] if plan.compact else jnp.int32(0)
  valid, pad, n_replay = status.sequence_status(plan.compact, plan.cap, plan.E, plan.R, entry,
                                                row, n, pending, starts=starts, W=plan.W)
  n = jnp.clip(n, 0, plan.R)
  row = jnp.where(valid, row, 0)
  return safe, row, n, valid, pad, n_replay, starts


def _window_plan(plan, n_rep, n, starts):
  """Compact: (flush, window row of the call's first kept row, pending rows after the call,
  the new `starts` bitmask), by `status.flushes` and `status.window_after`."""
  flush = status.flushes(plan.cfg, plan.R, n_rep, n)
  return (flush,) + status.window_after(plan.cfg, plan.R, n_rep, n, starts, flush)


# ----------------------------------------------------------------------------------------------
# prep: conv + dt
# ----------------------------------------------------------------------------------------------


def _prep_kernel(*, idx_ref, row_ref, n_ref, pend_ref=None, starts_ref=None, xbc_ref=None,
                 dt_ref=None, w_ref, cb_ref, dtb_ref, alog_ref, conv_ref, wx_ref=None,
                 wdt_ref=None, conv_out_ref, wx_out_ref=None, wdt_out_ref=None, xr_ref, dtr_ref,
                 dar_ref, info_ref, bounds_ref=None, plan: Plan):
  """Conv and dt of one sequence's rows, grid (C / block_c + 1, B).

  Refs (E pool entries, B sequences, RT scratch rows, K1 = K-1):
    idx_ref, row_ref, n_ref  [B] int32    cache_indices, state_row, num_rows
    pend_ref        [E] int32             compact: pending window rows
    starts_ref      [E] int32             compact: window rows that begin a call (bitmask)
    xbc_ref         [B, R, C]             new rows, raw (absent in a fold)
    dt_ref          [B, R, H]             their raw dt
    w_ref           [C, K] f32            conv taps, oldest first
    cb_ref [C], dtb_ref [H], alog_ref [H]   f32 conv bias, dt_bias, A_log
    conv_ref        snapshot [E, S, C, K1], compact [E, C, K1]; aliased to conv_out_ref
    wx_ref          compact [E, W, C]     window xBC; aliased to wx_out_ref (new rows go to
                                          window rows woff.. (`_window_plan`))
    wdt_ref         compact [E, W, H] f32   window dt, processed (the call's dt_limit applied);
                                          aliased to wdt_out_ref
  Outputs besides the aliased state:
    xr_ref          [B, RT, C] f32        post-conv rows (replayed at 0..W-1 in compact)
    dtr_ref, dar_ref  [B, RT, H] f32      processed dt and decay exp(dt A) of those rows
    info_ref        [B] int32             rows to replay, or -1: the call rejects the sequence
    bounds_ref      compact [B] int32     the sequence's `starts` before the call (the SSM
                                          kernel rounds a 16-bit state at them and writes the
                                          new bitmask)
  """
  cfg = plan.cfg
  K1, C, H = cfg.d_conv - 1, cfg.conv_dim, cfg.nheads
  BC = plan.block_c
  n_cblocks = C // BC
  BH = tiles_lib.pow2_divisor(H, 128)

  pid, b = pl.program_id(0), pl.program_id(1)
  e, row, n, valid, _, n_rep, starts = _load_status(plan, b, idx_ref, row_ref, n_ref, pend_ref,
                                                    starts_ref)
  off, commit, first_kept = plan.new_off, plan.commit, plan.first_kept
  if plan.compact:
    flush, woff, _, _ = _window_plan(plan, n_rep, n, starts)
  pre_rep = plan.compact and plan.unroll_replay
  pre_new = plan.R and plan.unroll_new

  def store_conv_base(cs, win):
    for j in range(K1):
      conv_out_ref[e, cs, j] = win[j].astype(plan.conv_dtype)

  @pl.when(valid & (pid < n_cblocks))
  def _conv():
    cs = pl.ds(pid * BC, BC)
    taps = [w_ref[cs, k] for k in range(K1 + 1)]
    bias = cb_ref[cs]
    load_rep = lambda j: wx_ref[e, j, cs]
    load_new = lambda i: xbc_ref[b, i, cs]
    if plan.compact:
      win = tuple(conv_ref[e, cs, j].astype(f32) for j in range(K1))
    else:
      win = tuple(conv_ref[e, row, cs, j].astype(f32) for j in range(K1))
    ahead = _Lookahead(None)
    rep_in = _prefetch(0, plan.W, load_rep, pre_rep, ahead)
    new_in = _prefetch(0, plan.R, load_new, pre_new, ahead)

    if plan.compact:
      def replay(j, raw, win, active):
        v = raw.astype(f32)
        xr_ref[b, j, cs] = rowmath.conv_output(taps, list(win) + [v], bias, plan.y_dtype,
                                               not plan.interpret)
        return _sel(active, win[1:] + (v,), win)

      win = _rows(0, plan.W, n_rep, load_rep, replay, win, rep_in)
      if commit == 0:
        pl.when((n_rep > 0) & flush)(lambda: store_conv_base(cs, win))
      backend.barrier(plan.interpret)
    if not plan.R:
      return

    def new_row(i, raw, win, active):
      v = raw.astype(f32)
      xr_ref[b, off + i, cs] = rowmath.conv_output(taps, list(win) + [v], bias,
                                                   plan.y_dtype, not plan.interpret)
      new_win = win[1:] + (v,)
      if plan.compact:
        def store_window():
          wx_out_ref[e, woff + i - commit, cs] = raw.astype(wx_out_ref.dtype)
        _kept(i, commit, active, store_window)
        if commit:
          pl.when(i == commit - 1)(lambda: store_conv_base(cs, new_win))
      else:
        def store_snapshot():
          for j in range(K1):
            conv_out_ref[e, i - first_kept, cs, j] = new_win[j].astype(plan.conv_dtype)
        _kept(i, first_kept, active, store_snapshot)
      assert active is None or not (commit or first_kept)   # see `_rows` on carries
      return new_win

    _rows(0, plan.R, n, load_new, new_row, win, new_in)

  @pl.when(pid == n_cblocks)
  def _dt():
    info_ref[b] = jnp.where(valid, n_rep, -1)
    if plan.compact:
      bounds_ref[b] = starts

    @pl.when(valid)
    def _():
      for hb in range(H // BH):
        hs = pl.ds(hb * BH, BH)
        bias, a_log = dtb_ref[hs], alog_ref[hs]
        load_rep = lambda j: wdt_ref[e, j, hs]
        load_new = lambda i: dt_ref[b, i, hs].astype(f32)
        ahead = _Lookahead(None)
        rep_in = _prefetch(0, plan.W, load_rep, pre_rep, ahead)
        new_in = _prefetch(0, plan.R, load_new, pre_new, ahead)

        def put(r, dtp):
          dtr_ref[b, r, hs] = dtp
          dar_ref[b, r, hs] = rowmath.decay(dtp, a_log)

        if plan.compact:
          def replay(j, dtp, c, active):      # the window holds processed dt
            put(j, dtp)
            return c
          _rows(0, plan.W, n_rep, load_rep, replay, 0, rep_in)
          backend.barrier(plan.interpret)
        if not plan.R:
          continue

        def new_row(i, raw, c, active):
          dtp = rowmath.process_dt(raw, bias, cfg.dt_limit)
          put(off + i, dtp)
          if plan.compact:
            def store_window():
              wdt_out_ref[e, woff + i - commit, hs] = dtp
            _kept(i, commit, active, store_window)
          return c

        _rows(0, plan.R, n, load_new, new_row, 0, new_in)


def prep(plan: Plan, params, state, xbc, dt, state_row, cache_indices, num_rows):
  """Runs the prep kernel. Returns its outputs by name (`_prep_kernel`)."""
  cfg = plan.cfg
  C, H, K1, E, cap, W = cfg.conv_dim, cfg.nheads, cfg.d_conv - 1, plan.E, plan.cap, plan.W
  sds = jax.ShapeDtypeStruct
  compact = plan.compact
  conv_shape = (E, C, K1) if compact else (E, cap, C, K1)
  return backend.pallas_call(
      lambda **refs: _prep_kernel(**refs, plan=plan),
      inputs=dict(idx_ref=cache_indices, row_ref=state_row, n_ref=num_rows,
                  pend_ref=state.pending if compact else None,
                  starts_ref=state.starts if compact else None,
                  xbc_ref=xbc if plan.R else None, dt_ref=dt if plan.R else None,
                  w_ref=params.conv_weight, cb_ref=params.conv_bias, dtb_ref=params.dt_bias,
                  alog_ref=params.A_log, conv_ref=state.conv,
                  wx_ref=state.win_xbc if compact else None,
                  wdt_ref=state.win_dt if compact else None),
      outputs=dict(conv_out_ref=sds(conv_shape, plan.conv_dtype),
                   wx_out_ref=sds((E, W, C), plan.y_dtype) if compact else None,
                   wdt_out_ref=sds((E, W, H), f32) if compact else None,
                   xr_ref=sds((plan.B, plan.RT, C), f32), dtr_ref=sds((plan.B, plan.RT, H), f32),
                   dar_ref=sds((plan.B, plan.RT, H), f32), info_ref=sds((plan.B,), jnp.int32),
                   bounds_ref=sds((plan.B,), jnp.int32) if compact else None),
      aliases=dict(conv_ref="conv_out_ref", wx_ref="wx_out_ref", wdt_ref="wdt_out_ref"),
      grid=(C // plan.block_c + 1, plan.B),
      num_warps=plan.tiles.prep_warps, num_stages=1, interpret=plan.interpret,
      name=f"m2v_prep_{cfg.replay_mode}_r{plan.R}")


# ----------------------------------------------------------------------------------------------
# ssm: state update + readout
# ----------------------------------------------------------------------------------------------


def _ssm_kernel(*, idx_ref, row_ref, n_ref, info_ref, bounds_ref=None, xr_ref, dtr_ref,
                dar_ref, z_ref=None, d_ref, ssm_ref, pend_ref=None, starts_ref=None, ssm_out_ref,
                pend_out_ref=None, starts_out_ref=None, y_ref=None, plan: Plan):
  """State update and y readout of one head's [block_p, N] state tile, grid (P / block_p, B, H).

  Refs (E pool entries, B sequences, RT scratch rows):
    idx_ref, row_ref, n_ref  [B] int32    cache_indices, state_row, num_rows
    info_ref        [B] int32             from prep: rows to replay, or -1 (rejected)
    bounds_ref      compact [B] int32     from prep: the `starts` bitmask before the call
    xr_ref          [B, RT, C] f32        post-conv rows (from prep)
    dtr_ref, dar_ref  [B, RT, H] f32      processed dt and decay (from prep)
    z_ref           [B, R, H*P]           optional gate
    d_ref           [H] f32               D
    ssm_ref         snapshot [E, S, H, P, N], compact [E, H, P, N], in the state dtype (widened
                    to f32 on load, rounded on store); aliased to ssm_out_ref
    pend_ref        compact [E] int32     pending rows; aliased to pend_out_ref
    starts_ref      compact [E] int32     `starts` bitmask; aliased to starts_out_ref (prep
                                          read it: this kernel only writes it)
    y_ref           [B, R, H*P]           output y (absent in a fold)

  The tile is held as A = N / n_cols tiles [block_p, n_cols], tile k holding n in
  [k n_cols, (k+1) n_cols): with n_cols = 32, Triton lays each out with 8 lanes on n and the
  other 4 lanes and the warps on p, so a thread holds A x 4 elements of one p. The readout
  sums the tiles' products elementwise, then over n_cols within the thread and across 8 lanes
  only (`rowmath.readout`). B and C rows come as [1, n_cols] tiles, which Triton gives the
  same layout (no conversion).

  With a 16-bit state dtype the running state is also rounded (`rounded`) where the other
  mode stores it: after the replay (compact; snapshot loads a stored slot), before each
  replayed row that began an earlier call (deferred commit: `bounds_ref`), and after row
  R - capacity - 1 of a call of R > capacity rows (compact commits the base there).
  """
  cfg = plan.cfg
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  BP, NC = plan.block_p, plan.n_cols
  tiles_n = [pl.ds(k * NC, NC) for k in range(N // NC)]
  fma = backend.fma(plan.interpret)

  pid_p, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  entry = idx_ref[b]
  e = status.safe_entry(entry, plan.E)
  info = info_ref[b]                         # rows to replay, or -1: rejected (from prep)
  valid, pad, n_rep = info >= 0, entry == -1, jnp.maximum(info, 0)
  n = jnp.clip(n_ref[b], 0, plan.R)
  g = h // cfg.heads_per_group
  ps = pl.ds(pid_p * BP, BP)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  off, commit, first_kept = plan.new_off, plan.commit, plan.first_kept

  def row_tiles(r, col0):                    # a B or C row as [1, NC] tiles
    return [xr_ref[b, pl.ds(r, 1), pl.ds(col0 + k * NC, NC)] for k in range(N // NC)]

  def load_rep(r):
    return (xr_ref[b, r, xcols][:, None], row_tiles(r, HP + g * N), dtr_ref[b, r, h],
            dar_ref[b, r, h])

  def load_new(i):
    r = off + i
    zv = z_ref[b, i, xcols] if plan.has_z else None
    return load_rep(r) + (row_tiles(r, HP + GN + g * N), zv)

  def update(st, x, bv, dtp, da):
    dtx = dtp * x
    return [rowmath.state_update(s_k, da, dtx, b_k, fma) for s_k, b_k in zip(st, bv)]

  def store_state(st, *slot):
    for cols, s_k in zip(tiles_n, st):
      ssm_out_ref[(e,) + slot + (h, ps, cols)] = s_k.astype(ssm_out_ref.dtype)

  def rounded(st):                           # the value a store then a load would give
    return [rowmath.stored(s_k, plan.state_dtype, not plan.interpret) for s_k in st]

  @pl.when(valid)
  def _run():
    slot = () if plan.compact else (row_ref[b],)
    st = [ssm_ref[(e,) + slot + (h, ps, cols)].astype(f32) for cols in tiles_n]
    ahead = _Lookahead(plan.tiles.prefetch)
    rep_in = _prefetch(0, plan.W, load_rep, plan.compact and plan.unroll_replay, ahead)
    new_in = _prefetch(0, plan.R, load_new, plan.R and plan.unroll_new, ahead)
    if plan.compact:
      # Replayed rows branch on `active` (a uniform scalar) instead of selecting, so a call
      # that replays fewer than W rows does not pay for the others.
      bounds = bounds_ref[b]
      flush, _, new_pending, new_starts = _window_plan(plan, n_rep, n, bounds)

      def replay_row(j, a, st):
        if plan.cfg.deferred and plan.state_dtype != f32:
          began_call = ((bounds >> j) & 1) > 0         # j <= 31: W <= 32
          st = _sel(began_call, rounded(st), st)
        return update(st, *a)

      st = _rows(0, plan.W, n_rep, load_rep,
                 lambda j, a, st, active: _if(active, lambda s: replay_row(j, a, s), st), st,
                 rep_in)
      st = rounded(st)
      if commit == 0:
        pl.when((n_rep > 0) & flush)(lambda: store_state(st))

      @pl.when((pid_p == 0) & (h == 0))
      def _():
        pend_out_ref[e] = new_pending
        starts_out_ref[e] = new_starts
    if not plan.R:
      return

    # Unrolled rows collect y in a [BP, R] tile and store it once (R a power of two, as
    # Triton tiles must be): a per-row store would move each row's y between layouts.
    collect = new_in is not None and not plan.R & (plan.R - 1)
    col = lax.broadcasted_iota(jnp.int32, (BP, plan.R), 1)

    def new_row(i, inputs, carry, active):
      st, ys = carry
      x, bv, dtp, da, cv, zv = inputs
      new_st = update(st, x, bv, dtp, da)
      y = rowmath.readout(backend.isolate(new_st, plan.interpret), cv, d_ref[h], x[:, 0], fma)
      if plan.has_z:
        y = rowmath.gate(y, zv.astype(f32))
      y = _sel(active, y, jnp.zeros_like(y))
      if collect:
        ys = jnp.where(col == i, y[:, None], ys)
      else:
        y_ref[b, i, xcols] = y.astype(y_ref.dtype)
      if plan.compact:
        if commit:
          pl.when(i == commit - 1)(lambda: store_state(new_st))
      else:
        _kept(i, first_kept, active, lambda: store_state(new_st, i - first_kept))
      assert active is None or not (commit or first_kept)   # see `_rows` on carries
      last_unkept = commit if plan.compact else first_kept
      if last_unkept and plan.state_dtype != f32:
        new_st = _sel(i == last_unkept - 1, rounded(new_st), new_st)
      return new_st, ys

    ys = jnp.zeros((BP, plan.R), f32) if collect else jnp.int32(0)
    _, ys = _rows(0, plan.R, n, load_new, new_row, (st, ys), new_in)
    if collect:
      y_ref[b, pl.ds(0, plan.R), xcols] = ys.T.astype(y_ref.dtype)

    if new_in is None:
      def zero_row(i, c):
        y_ref[b, i, xcols] = jnp.zeros((BP,), y_ref.dtype)
        return c

      lax.fori_loop(n, plan.R, zero_row, 0)

  if plan.R:
    @pl.when(~valid)
    def _fill():
      nans = jnp.full((BP,), jnp.nan, f32)
      fill = jnp.where(pad, jnp.zeros((BP,), f32), nans).astype(y_ref.dtype)

      def fill_row(i, c):
        y_ref[b, i, xcols] = fill
        return c

      lax.fori_loop(0, plan.R, fill_row, 0)


def ssm(plan: Plan, params, state, prepped, state_row, z, cache_indices, num_rows):
  """Runs the SSM kernel on prep's outputs. Returns its outputs by name (`_ssm_kernel`)."""
  cfg = plan.cfg
  H, P, N, E, cap = cfg.nheads, cfg.headdim, cfg.dstate, plan.E, plan.cap
  sds = jax.ShapeDtypeStruct
  compact = plan.compact
  return backend.pallas_call(
      lambda **refs: _ssm_kernel(**refs, plan=plan),
      inputs=dict(idx_ref=cache_indices, row_ref=state_row, n_ref=num_rows,
                  info_ref=prepped["info_ref"], bounds_ref=prepped.get("bounds_ref"),
                  xr_ref=prepped["xr_ref"],
                  dtr_ref=prepped["dtr_ref"], dar_ref=prepped["dar_ref"],
                  z_ref=z if plan.has_z else None, d_ref=params.D, ssm_ref=state.ssm,
                  pend_ref=state.pending if compact else None,
                  starts_ref=state.starts if compact else None),
      outputs=dict(ssm_out_ref=sds((E, H, P, N) if compact else (E, cap, H, P, N),
                                   plan.state_dtype),
                   pend_out_ref=sds((E,), jnp.int32) if compact else None,
                   starts_out_ref=sds((E,), jnp.int32) if compact else None,
                   y_ref=sds((plan.B, plan.R, cfg.d_inner), plan.y_dtype) if plan.R else None),
      aliases=dict(ssm_ref="ssm_out_ref", pend_ref="pend_out_ref", starts_ref="starts_out_ref"),
      grid=(P // plan.block_p, plan.B, H),
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages,
      interpret=plan.interpret,
      name=f"m2v_ssm_{cfg.replay_mode}_r{plan.R}")


def run(plan: Plan, params, state, xbc, dt, state_row, z, cache_indices, num_rows):
  """Runs prep + ssm for one call (`plan.R` = 0: a compact fold, no new rows).

  Returns (y [B, R, H*P] in the activation dtype, or None for a fold; the new state pytree).
  """
  prepped = prep(plan, params, state, xbc, dt, state_row, cache_indices, num_rows)
  out = ssm(plan, params, state, prepped, state_row, z, cache_indices, num_rows)
  if plan.compact:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"],
                      win_xbc=prepped["wx_out_ref"], win_dt=prepped["wdt_out_ref"],
                      pending=out["pend_out_ref"], starts=out["starts_out_ref"])
  else:
    new = type(state)(ssm=out["ssm_out_ref"], conv=prepped["conv_out_ref"])
  return out.get("y_ref"), new

"""Serial (row-by-row) Pallas kernels of both replay modes: the verify path.

A call runs two kernels on the Triton lowering:

1. `prep` (grid: conv-channel blocks + 1, batch). Each program owns a block of conv channels
   of one sequence: it reads the starting conv state, replays pending window rows (compact),
   runs the new rows through the causal conv, writes the conv snapshots (snapshot mode) or
   the new base conv state and window rows (compact mode) in place, and writes the post-conv
   activations of every row it ran to a float32 scratch `xr [B, RT, C]`. The extra program
   per sequence processes dt (bias, softplus, clamp, decay) into `dtr`, `dAr [B, RT, H]`,
   updates the window's dt rows, and writes the sequence's status to `info [B]` (the number
   of rows to replay, or -1 if the call rejects the sequence). Ownership is disjoint, and
   each program reads what it owns before writing it, so the in-place updates have no races.
2. `ssm` (grid: P / block_p, batch, heads). Each program owns a [block_p, N] float32 tile of
   one head's state, kept in registers: it loads it once, replays the pending rows (compact),
   runs the new rows (state update and y readout), and stores the tile as the snapshot of
   every row (snapshot mode) or once as the new base (compact mode). It reads the status from
   `info`, so it can also update the compact `pending` counts in place (prep reads them).

Verify-sized calls unroll their row loops and issue each row's loads ahead of the stores of
earlier rows (`_Lookahead`: all rows up front in prep, `tiles.prefetch` rows ahead in the SSM
kernel, where every prefetched B/C row costs registers): the compiler cannot move a load above
a store to memory that might alias, so a load-compute-store loop pays one memory latency per
row.

Rows are indexed in the scratch as `RT = R` (snapshot) or `RT = W + R` (compact: replayed
window rows at 0..W-1, new rows at W..W+R-1).

Both modes run the same kernel functions with a different static `Plan`, call `rowmath` for
every arithmetic step, and use the same (block_p, num_warps), so their y and states agree
bitwise. Invalid sequences (bad `state_row`, entry, or `num_rows`, checked on the device) run
nothing: their state is untouched and their y rows are NaN; padding entries (-1) get y = 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import _backend
from m2v_jax import config as config_lib
from m2v_jax import rowmath

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
  tiles: config_lib.TileConfig
  interpret: bool

  @property
  def compact(self) -> bool:
    return self.cfg.replay_mode == config_lib.COMPACT

  @property
  def cap(self) -> int:
    return self.cfg.capacity

  @property
  def first_kept(self) -> int:
    """Snapshot: rows before the first one whose state is stored (R > S keeps the last S)."""
    return max(self.R - self.cap, 0)

  @property
  def commit(self) -> int:
    """Compact: new rows folded into the base (R > W leaves the last W pending)."""
    return max(self.R - self.cap, 0)

  @property
  def new_off(self) -> int:
    return self.cap if self.compact else 0

  @property
  def RT(self) -> int:
    return self.new_off + self.R

  @property
  def block_c(self) -> int:
    """Conv channels per prep program: the tile's block_c, shrunk to divide C."""
    return config_lib.pow2_divisor(self.cfg.conv_dim, self.tiles.block_c)

  @property
  def block_p(self) -> int:
    """P rows per SSM program: the tile's block_p, shrunk to divide P."""
    return config_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def unroll_new(self) -> bool:
    """Unroll the new-row loop (verify-sized calls) instead of a `fori_loop` (prefill)."""
    return self.tiles.unroll and self.R <= self.cap

  @property
  def unroll_replay(self) -> bool:
    return self.tiles.unroll and self.cap <= MAX_UNROLL


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


def sequence_status(compact: bool, cap: int, E: int, R: int, entry, row, n, pending):
  """Per-sequence validity, shared by both kernels and the op wrapper (scalars or arrays).

  Args:
    compact: mode.
    cap: S or W.
    E: pool entries.
    R: rows in the call (0 for a fold).
    entry: pool index (-1 = padding).
    row: `state_row`.
    n: `num_rows` (R when not given).
    pending: the entry's pending-row count (compact; ignored in snapshot mode).

  Returns:
    (valid, pad, n_replay): valid = the call runs for this sequence; pad = padding entry;
    n_replay = window rows to fold first (compact), clipped to [0, cap].
  """
  in_pool = (entry >= 0) & (entry < E)
  if compact:
    row_ok = jnp.where(pending > 0, (row >= 0) & (row < pending), row == 0)
    n_replay = jnp.clip(jnp.where(pending > 0, row + 1, 0), 0, cap)
  else:
    row_ok = (row >= 0) & (row < cap)
    n_replay = jnp.zeros_like(row)
  n_ok = (n >= 1) & (n <= R) if R else (n == 0)
  return in_pool & row_ok & n_ok, entry == -1, n_replay


def safe_entry(entry, E: int):
  """The pool entry to address: `entry` when it is in [0, E), else 0 (then only masked
  work uses it)."""
  return jnp.where((entry >= 0) & (entry < E), entry, 0)


def entry_status(cfg: config_lib.Mamba2Config, state, state_row, R: int, cache_indices,
                 num_rows=None):
  """(safe entry [B], valid [B], padding [B]) of a call of R rows, computed on the device
  with the kernels' rule (`sequence_status`)."""
  B = state_row.shape[0]
  ci, nr = index_defaults(B, R, cache_indices, num_rows)
  E = state.ssm.shape[0]
  safe = safe_entry(ci, E)
  compact = cfg.replay_mode == config_lib.COMPACT
  pending = state.pending[safe] if compact else jnp.zeros_like(ci)
  valid, pad, _ = sequence_status(compact, cfg.capacity, E, R, ci,
                                  jnp.asarray(state_row, jnp.int32), nr, pending)
  return safe, valid, pad


def index_defaults(B, R, cache_indices, num_rows):
  """cache_indices (default arange(B)) and num_rows (default R) as int32 [B] arrays."""
  ci = (jnp.arange(B, dtype=jnp.int32) if cache_indices is None
        else jnp.asarray(cache_indices, jnp.int32))
  nr = jnp.full((B,), R, jnp.int32) if num_rows is None else jnp.asarray(num_rows, jnp.int32)
  return ci, nr


def _load_status(plan, b, idx_ref, row_ref, n_ref, pend_ref):
  entry, row, n = idx_ref[b], row_ref[b], n_ref[b]
  safe = safe_entry(entry, plan.E)
  pending = pend_ref[safe] if plan.compact else jnp.int32(0)
  valid, pad, n_replay = sequence_status(plan.compact, plan.cap, plan.E, plan.R, entry, row, n,
                                         pending)
  n = jnp.clip(n, 0, plan.R)
  row = jnp.where(valid, row, 0)
  return safe, row, n, valid, pad, n_replay


# ----------------------------------------------------------------------------------------------
# prep: conv + dt
# ----------------------------------------------------------------------------------------------


def _prep_kernel(*refs, plan: Plan):
  cfg = plan.cfg
  K1, C, H = cfg.d_conv - 1, cfg.conv_dim, cfg.nheads
  BC = plan.block_c
  n_cblocks = C // BC
  BH = config_lib.pow2_divisor(H, 128)
  refs = list(refs)
  idx_ref, row_ref, n_ref = refs[:3]
  del refs[:3]
  pend_ref = refs.pop(0) if plan.compact else None
  if plan.R:
    xbc_ref, dt_ref = refs.pop(0), refs.pop(0)
  w_ref, cb_ref, dtb_ref, alog_ref = refs[:4]
  del refs[:4]
  if plan.compact:
    conv_in, wx_in, wdt_in, conv_out, wx_out, wdt_out, xr_ref, dtr_ref, dar_ref, info_ref = refs
  else:
    conv_in, conv_out, xr_ref, dtr_ref, dar_ref, info_ref = refs

  pid, b = pl.program_id(0), pl.program_id(1)
  e, row, n, valid, _, n_rep = _load_status(plan, b, idx_ref, row_ref, n_ref, pend_ref)
  off, commit, first_kept = plan.new_off, plan.commit, plan.first_kept
  pre_rep = plan.compact and plan.unroll_replay
  pre_new = plan.R and plan.unroll_new

  def store_conv_base(cs, win):
    for j in range(K1):
      conv_out[e, cs, j] = win[j].astype(plan.conv_dtype)

  @pl.when(valid & (pid < n_cblocks))
  def _conv():
    cs = pl.ds(pid * BC, BC)
    taps = [w_ref[cs, k] for k in range(K1 + 1)]
    bias = cb_ref[cs]
    load_rep = lambda j: wx_in[e, j, cs]
    load_new = lambda i: xbc_ref[b, i, cs]
    if plan.compact:
      win = tuple(conv_in[e, cs, j].astype(f32) for j in range(K1))
    else:
      win = tuple(conv_in[e, row, cs, j].astype(f32) for j in range(K1))
    ahead = _Lookahead(None)
    rep_in = _prefetch(0, plan.cap, load_rep, pre_rep, ahead)
    new_in = _prefetch(0, plan.R, load_new, pre_new, ahead)

    if plan.compact:
      def replay(j, raw, win, active):
        v = raw.astype(f32)
        xr_ref[b, j, cs] = rowmath.conv_output(taps, list(win) + [v], bias)
        return _sel(active, win[1:] + (v,), win)

      win = _rows(0, plan.cap, n_rep, load_rep, replay, win, rep_in)
      if commit == 0:
        pl.when(n_rep > 0)(lambda: store_conv_base(cs, win))
      _backend.barrier(plan.interpret)
    if not plan.R:
      return

    def new_row(i, raw, win, active):
      v = raw.astype(f32)
      xr_ref[b, off + i, cs] = rowmath.conv_output(taps, list(win) + [v], bias)
      new_win = win[1:] + (v,)
      if plan.compact:
        def store_window():
          wx_out[e, i - commit, cs] = raw.astype(wx_out.dtype)
        _kept(i, commit, active, store_window)
        if commit:
          pl.when(i == commit - 1)(lambda: store_conv_base(cs, new_win))
      else:
        def store_snapshot():
          for j in range(K1):
            conv_out[e, i - first_kept, cs, j] = new_win[j].astype(plan.conv_dtype)
        _kept(i, first_kept, active, store_snapshot)
      assert active is None or not (commit or first_kept)   # see `_rows` on carries
      return new_win

    _rows(0, plan.R, n, load_new, new_row, win, new_in)

  @pl.when(pid == n_cblocks)
  def _dt():
    info_ref[b] = jnp.where(valid, n_rep, -1)

    @pl.when(valid)
    def _():
      for hb in range(H // BH):
        hs = pl.ds(hb * BH, BH)
        bias, a_log = dtb_ref[hs], alog_ref[hs]
        load_rep = lambda j: wdt_in[e, j, hs]
        load_new = lambda i: dt_ref[b, i, hs].astype(f32)
        ahead = _Lookahead(None)
        rep_in = _prefetch(0, plan.cap, load_rep, pre_rep, ahead)
        new_in = _prefetch(0, plan.R, load_new, pre_new, ahead)

        def put(r, raw):
          dtp = rowmath.process_dt(raw, bias, cfg.dt_limit)
          dtr_ref[b, r, hs] = dtp
          dar_ref[b, r, hs] = rowmath.decay(dtp, a_log)

        if plan.compact:
          def replay(j, raw, c, active):
            put(j, raw)
            return c
          _rows(0, plan.cap, n_rep, load_rep, replay, 0, rep_in)
          _backend.barrier(plan.interpret)
        if not plan.R:
          continue

        def new_row(i, raw, c, active):
          put(off + i, raw)
          if plan.compact:
            def store_window():
              wdt_out[e, i - commit, hs] = raw
            _kept(i, commit, active, store_window)
          return c

        _rows(0, plan.R, n, load_new, new_row, 0, new_in)


def prep_call(plan: Plan):
  """The prep kernel as a function of arrays (see `_prep_kernel` for the argument order)."""
  cfg = plan.cfg
  C, H = cfg.conv_dim, cfg.nheads
  n_cblocks = C // plan.block_c
  n_scalar = 4 if plan.compact else 3
  n_in = n_scalar + (2 if plan.R else 0) + 4
  state_shapes = _prep_state_shapes(plan)
  scratch = [jax.ShapeDtypeStruct((plan.B, plan.RT, C), f32),
             jax.ShapeDtypeStruct((plan.B, plan.RT, H), f32),
             jax.ShapeDtypeStruct((plan.B, plan.RT, H), f32),
             jax.ShapeDtypeStruct((plan.B,), jnp.int32)]
  return _backend.pallas_call(
      lambda *refs: _prep_kernel(*refs, plan=plan),
      grid=(n_cblocks + 1, plan.B),
      out_shape=tuple(state_shapes) + tuple(scratch),
      input_output_aliases={n_in + i: i for i in range(len(state_shapes))},
      num_warps=plan.tiles.prep_warps, num_stages=1, interpret=plan.interpret,
      name=f"m2v_prep_{plan.cfg.replay_mode}_r{plan.R}")


def _prep_state_shapes(plan):
  cfg = plan.cfg
  C, H, K1, E, cap = cfg.conv_dim, cfg.nheads, cfg.d_conv - 1, plan.E, plan.cap
  sds = jax.ShapeDtypeStruct
  if plan.compact:
    return [sds((E, C, K1), plan.conv_dtype), sds((E, cap, C), plan.y_dtype),
            sds((E, cap, H), f32)]
  return [sds((E, cap, C, K1), plan.conv_dtype)]


# ----------------------------------------------------------------------------------------------
# ssm: state update + readout
# ----------------------------------------------------------------------------------------------


def _ssm_kernel(*refs, plan: Plan):
  cfg = plan.cfg
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  BP = plan.block_p
  refs = list(refs)
  idx_ref, row_ref, n_ref, info_ref, xr_ref, dtr_ref, dar_ref = refs[:7]
  del refs[:7]
  z_ref = refs.pop(0) if plan.has_z else None
  d_ref, ssm_in = refs[:2]
  del refs[:2]
  pend_in = refs.pop(0) if plan.compact else None
  ssm_out = refs.pop(0)
  pend_out = refs.pop(0) if plan.compact else None
  y_ref = refs.pop(0) if plan.R else None
  del pend_in

  pid_p, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  entry = idx_ref[b]
  e = safe_entry(entry, plan.E)
  info = info_ref[b]                         # rows to replay, or -1: rejected (from prep)
  valid, pad, n_rep = info >= 0, entry == -1, jnp.maximum(info, 0)
  n = jnp.clip(n_ref[b], 0, plan.R)
  g = h // cfg.heads_per_group
  ps = pl.ds(pid_p * BP, BP)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  bcols = pl.ds(HP + g * N, N)
  ccols = pl.ds(HP + GN + g * N, N)
  off, commit, first_kept = plan.new_off, plan.commit, plan.first_kept

  def load_rep(r):
    return xr_ref[b, r, xcols], xr_ref[b, r, bcols], dtr_ref[b, r, h], dar_ref[b, r, h]

  def load_new(i):
    r = off + i
    zv = z_ref[b, i, xcols] if plan.has_z else None
    return load_rep(r) + (xr_ref[b, r, ccols], zv)

  def update(st, x, bv, dtp, da):
    return rowmath.state_update(st, da, dtp * x, bv)

  def store_base(st):
    ssm_out[e, h, ps, :] = st

  @pl.when(valid)
  def _run():
    if plan.compact:
      st = ssm_in[e, h, ps, :]
    else:
      st = ssm_in[e, row_ref[b], h, ps, :]
    ahead = _Lookahead(plan.tiles.prefetch)
    rep_in = _prefetch(0, plan.cap, load_rep, plan.compact and plan.unroll_replay, ahead)
    new_in = _prefetch(0, plan.R, load_new, plan.R and plan.unroll_new, ahead)
    if plan.compact:
      # Replayed rows branch on `active` (a uniform scalar) instead of selecting, so a call
      # that replays fewer than W rows does not pay for the others.
      st = _rows(0, plan.cap, n_rep, load_rep,
                 lambda j, a, st, active: _if(active, lambda s: update(s, *a), st), st, rep_in)
      if commit == 0:
        pl.when(n_rep > 0)(lambda: store_base(st))

      @pl.when((pid_p == 0) & (h == 0))
      def _():
        pend_out[e] = n - commit
    if not plan.R:
      return

    def new_row(i, inputs, st, active):
      x, bv, dtp, da, cv, zv = inputs
      new_st = update(st, x, bv, dtp, da)
      y = rowmath.readout(_backend.isolate(new_st, plan.interpret), cv, d_ref[h], x)
      if plan.has_z:
        y = rowmath.gate(y, zv.astype(f32))
      y_ref[b, i, xcols] = _sel(active, y, jnp.zeros_like(y)).astype(y_ref.dtype)
      if plan.compact:
        if commit:
          pl.when(i == commit - 1)(lambda: store_base(new_st))
      else:
        def store_snapshot():
          ssm_out[e, i - first_kept, h, ps, :] = new_st
        _kept(i, first_kept, active, store_snapshot)
      assert active is None or not (commit or first_kept)   # see `_rows` on carries
      return new_st

    _rows(0, plan.R, n, load_new, new_row, st, new_in)

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


def ssm_call(plan: Plan):
  """The SSM kernel as a function of arrays (see `_ssm_kernel` for the argument order)."""
  cfg = plan.cfg
  H, P, N, E, cap = cfg.nheads, cfg.headdim, cfg.dstate, plan.E, plan.cap
  sds = jax.ShapeDtypeStruct
  outs = [sds((E, H, P, N), f32) if plan.compact else sds((E, cap, H, P, N), f32)]
  n_in = 7 + (1 if plan.has_z else 0) + 1
  aliases = {n_in: 0}
  if plan.compact:
    outs.append(sds((E,), jnp.int32))
    aliases[n_in + 1] = 1
  if plan.R:
    outs.append(sds((plan.B, plan.R, cfg.d_inner), plan.y_dtype))
  return _backend.pallas_call(
      lambda *refs: _ssm_kernel(*refs, plan=plan),
      grid=(P // plan.block_p, plan.B, H),
      out_shape=tuple(outs),
      input_output_aliases=aliases,
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages,
      interpret=plan.interpret,
      name=f"m2v_ssm_{plan.cfg.replay_mode}_r{plan.R}")


def run(plan: Plan, params, state, xbc, dt, state_row, z, cache_indices, num_rows):
  """Runs prep + ssm for one call. Returns (y, or None for a fold; the new state pytree)."""
  scal = [cache_indices, state_row, num_rows]
  inputs = [xbc, dt] if plan.R else []
  wts = [params.conv_weight, params.conv_bias, params.dt_bias, params.A_log]
  zin = [z] if plan.has_z else []
  if plan.compact:
    conv, wx, wdt, xr, dtr, dar, info = prep_call(plan)(*scal, state.pending, *inputs, *wts,
                                                         state.conv, state.win_xbc, state.win_dt)
    outs = ssm_call(plan)(*scal, info, xr, dtr, dar, *zin, params.D, state.ssm, state.pending)
    new = type(state)(ssm=outs[0], conv=conv, win_xbc=wx, win_dt=wdt, pending=outs[1])
  else:
    conv, xr, dtr, dar, info = prep_call(plan)(*scal, *inputs, *wts, state.conv)
    outs = ssm_call(plan)(*scal, info, xr, dtr, dar, *zin, params.D, state.ssm)
    new = type(state)(ssm=outs[0], conv=conv)
  return (outs[-1] if plan.R else None), new

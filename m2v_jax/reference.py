"""The jax.numpy reference backend of every op, and `rows`, the serial oracle of the kernel tests.

The calls use the kernels' formulas (`rowmath`, `dual`) and segments with float32 products;
the chunked (SSD) form is `m2v_jax.reference_ssd`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import jax

from m2v_jax import config as config_lib
from m2v_jax import status
from m2v_jax import tree
from m2v_jax.kernels import backend
from m2v_jax.kernels import dual
from m2v_jax.kernels import rowmath
from m2v_jax.params import LayerParams
from m2v_jax.state import CompactState, SnapshotState

f32 = jnp.float32


def _split_xbc(cfg, v):
  """[B, C] post-conv -> x [B, H, P], B and C expanded per head [B, H, N]."""
  Bsz = v.shape[0]
  H, P, G, N = cfg.nheads, cfg.headdim, cfg.ngroups, cfg.dstate
  HP, GN = cfg.d_inner, G * N
  x = v[:, :HP].reshape(Bsz, H, P)
  bm = jnp.repeat(v[:, HP:HP + GN].reshape(Bsz, G, N), cfg.heads_per_group, axis=1)
  cm = jnp.repeat(v[:, HP + GN:].reshape(Bsz, G, N), cfg.heads_per_group, axis=1)
  return x, bm, cm


def _one_row(cfg, params, taps, st, win, v, d, zt, dtype):
  """One row (docs/semantics.md) from state st [B, H, P, N] and conv window `win` (K-1 [B, C]
  arrays) on raw input v [B, C] float32: (the new state, y [B, H, P] gated where zt is given)."""
  out = rowmath.conv_output(taps, win + [v], params.conv_bias, dtype)
  x, bm, cm = _split_xbc(cfg, out)
  dtp = rowmath.process_dt(d.astype(f32), params.dt_bias, cfg.dt_limit)
  dA = rowmath.decay(dtp, params.A_log)
  new_st = rowmath.state_update(st, dA[..., None, None], (dtp[..., None] * x)[..., None],
                                bm[..., None, :])
  y = rowmath.readout(new_st, cm[..., None, :], params.D[:, None], x)
  if zt is not None:
    y = rowmath.gate(y, zt.astype(f32).reshape(y.shape))
  return new_st, y


def rows(cfg: config_lib.Mamba2Config, params: LayerParams, ssm0, conv0, xbc, dt, z=None,
         num_rows=None, keep: int = 0):
  """The oracle: rows 0..R-1 one after another, y read out of each row's state.

  Args:
    cfg, params: geometry and parameters.
    ssm0: [B, H, P, N] float32 starting state.
    conv0: [B, C, K-1] starting conv state (any float dtype).
    xbc: [B, R, C] raw inputs; dt: [B, R, H] raw dt; z: optional [B, R, H*P] gate.
    num_rows: optional [B] int32; later rows leave the state unchanged and give y 0.
    keep: return the states after the last `keep` rows.

  Returns:
    y [B, R, H*P], ssm [B, keep, H, P, N], conv [B, keep, C, K-1], all float32.
  """
  Bsz, R, C = xbc.shape
  H, P, K = cfg.nheads, cfg.headdim, cfg.d_conv
  taps = [params.conv_weight[:, k] for k in range(K)]
  if num_rows is None:
    num_rows = jnp.full((Bsz,), R, jnp.int32)
  keep = min(keep, R)

  def step(carry, inp):
    st, win = carry
    t, xb, d, zt = inp
    v = xb.astype(f32)
    new_st, y = _one_row(cfg, params, taps, st, list(win), v, d, zt, xbc.dtype)
    active = t < num_rows
    st = jnp.where(active[:, None, None, None], new_st, st)
    new_win = tuple(win[1:]) + (v,)
    win = tuple(jnp.where(active[:, None], a, b) for a, b in zip(new_win, win))
    y = jnp.where(active[:, None, None], y, 0.0).reshape(Bsz, H * P)
    return (st, win), (y, st, jnp.stack(win, axis=-1))

  ts = jnp.arange(R, dtype=jnp.int32)
  zs = None if z is None else jnp.swapaxes(z, 0, 1)
  win0 = tuple(conv0[..., j].astype(f32) for j in range(K - 1))
  _, (y, states, convs) = lax.scan(step, (ssm0.astype(f32), win0),
                                   (ts, jnp.swapaxes(xbc, 0, 1), jnp.swapaxes(dt, 0, 1), zs))
  return (jnp.swapaxes(y, 0, 1), jnp.swapaxes(states[R - keep:], 0, 1),
          jnp.swapaxes(convs[R - keep:], 0, 1))


def tree_rows(cfg: config_lib.Mamba2Config, params: LayerParams, ssm0, conv0, xbc, dt, parents,
              z=None, num_rows=None):
  """The oracle of a draft tree: each row's state and conv window from its parent's.

  Row r runs one row (docs/semantics.md) from the state and conv window after row
  `parents[b, r]`, or from `ssm0` and `conv0` where that is -1 (the root, row 0). A chain
  (`parents[b, r] = r - 1`) gives `rows`' results bitwise.

  Args:
    cfg, params: geometry and parameters.
    ssm0: [B, H, P, N] float32 state before the root.
    conv0: [B, C, K-1] conv state before the root (any float dtype).
    xbc: [B, R, C] raw inputs; dt: [B, R, H] raw dt; z: optional [B, R, H*P] gate.
    parents: [B, R] int32, each row's parent row, -1 for the root; a parent comes before its
      child (`checks.parents`).
    num_rows: optional [B] int32; rows from it on keep their parent's state and give y 0.

  Returns:
    y [B, R, H*P], ssm [B, R, H, P, N] (the state after each row), conv [B, R, C, K-1] (the
    conv window after each row), all float32.
  """
  Bsz, R, C = xbc.shape
  H, P, K = cfg.nheads, cfg.headdim, cfg.d_conv
  taps = [params.conv_weight[:, k] for k in range(K)]
  if num_rows is None:
    num_rows = jnp.full((Bsz,), R, jnp.int32)
  parents = jnp.asarray(parents, jnp.int32)
  ssm0 = ssm0.astype(f32)
  win0 = jnp.swapaxes(conv0.astype(f32), 1, 2)                       # [B, K-1, C]

  def step(carry, inp):
    states, wins = carry                        # [B, R, H, P, N], [B, R, K-1, C]
    t, xb, d, zt, par = inp
    st, win = tree.from_parent(states, ssm0, par), tree.from_parent(wins, win0, par)
    v = xb.astype(f32)
    new_st, y = _one_row(cfg, params, taps, st, [win[:, j] for j in range(K - 1)], v, d, zt,
                         xbc.dtype)
    active = t < num_rows
    new_st = jnp.where(active[:, None, None, None], new_st, st)
    new_win = jnp.concatenate([win[:, 1:], v[:, None]], axis=1)
    new_win = jnp.where(active[:, None, None], new_win, win)
    y = jnp.where(active[:, None, None], y, 0.0).reshape(Bsz, H * P)
    states = states.at[:, t].set(new_st)
    wins = wins.at[:, t].set(new_win)
    return (states, wins), y

  ts = jnp.arange(R, dtype=jnp.int32)
  sw = lambda a: None if a is None else jnp.swapaxes(a, 0, 1)
  init = (jnp.zeros((Bsz, R) + ssm0.shape[1:], f32), jnp.zeros((Bsz, R, K - 1, C), f32))
  (states, wins), y = lax.scan(step, init, (ts, sw(xbc), sw(dt), sw(z), sw(parents)))
  return jnp.swapaxes(y, 0, 1), states, jnp.swapaxes(wins, 2, 3)


def round_state(st, state_dtype):
  """`st` as a store to, then a load from, a `state_dtype` pool gives it."""
  return rowmath.stored(st, state_dtype)


def finish_y(y, valid, pad, dtype):
  """y with NaN rows for rejected sequences and zeros for padding, in `dtype`."""
  y = jnp.where(valid[:, None, None], y, jnp.nan)
  y = jnp.where(pad[:, None, None], 0.0, y)
  return y.astype(dtype)


def _scatter(pool, idx, write, new):
  """pool[idx[b]] = new[b] where write[b]."""
  target = jnp.where(write, idx, pool.shape[0])        # out of bounds -> dropped
  return pool.at[target].set(new.astype(pool.dtype), mode="drop")


_PRODUCTS = backend.Products(exact_rows=False, tensor_cores=False)


def _outputs_one(S, x, b, c, dt, A, D, valid):
  return dual.outputs([S], x, [b], [c], dt, A, D, valid, _PRODUCTS)


# vmapped over heads, then sequences: y [B, H, P, KT].
_outputs_all = jax.vmap(jax.vmap(_outputs_one, in_axes=(0, 0, 0, 0, 0, 0, 0, None)),
                        in_axes=(0, 0, 0, 0, 0, None, None, 0))


def _advance(params, S, x, bm, dt, active, began=None, state_dtype=f32):
  """The state S [B, H, P, N] after rows x, bm, dt [B, L, ...] where `active` [B, L]; with
  `began` [B, L] a 16-bit state rounds before each row that began a call. Returns (S, states
  after every row [B, L, H, P, N]).
  """
  def step(S, inp):
    xr, br, dr, act, bg = inp
    if bg is not None and jnp.dtype(state_dtype) != f32:
      S = jnp.where(bg[:, None, None, None], round_state(S, state_dtype), S)
    dA = rowmath.decay(dr, params.A_log)[..., None, None]
    new = rowmath.state_update(S, dA, (dr[..., None] * xr)[..., None], br[..., None, :])
    S = jnp.where(act[:, None, None, None], new, S)
    return S, S
  sw = lambda a: None if a is None else jnp.swapaxes(a, 0, 1)
  S, states = lax.scan(step, S, (sw(x), sw(bm), sw(dt), sw(active), sw(began)))
  return S, jnp.swapaxes(states, 0, 1)


def _split_rows(cfg, v, dt):
  """v [B, K, C], dt [B, K, H] -> x [B, H, K, P], B and C [B, H, K, N], dt [B, H, K], float32."""
  Bsz, K = v.shape[:2]
  H, P, G, N = cfg.nheads, cfg.headdim, cfg.ngroups, cfg.dstate
  HP, GN = cfg.d_inner, G * N
  per_head = lambda a: jnp.repeat(a.reshape(Bsz, K, G, N), cfg.heads_per_group, axis=2)
  x = v[..., :HP].reshape(Bsz, K, H, P)
  t = lambda a: jnp.swapaxes(a, 1, 2).astype(f32)
  cm = t(per_head(v[..., HP + GN:HP + 2 * GN])) if v.shape[-1] > HP + GN else None
  return t(x), t(per_head(v[..., HP:HP + GN])), cm, t(dt)


def _tile(a, t0, KT):
  """Rows t0 .. t0 + KT - 1 of a [B, RT, ...]."""
  return lax.dynamic_slice_in_dim(a, t0, KT, axis=1)


def _new_rows(cfg, params, conv0, xbc, dt, n):
  """Post-conv rows [B, RT, C] and processed dt [B, RT, H] f32 of a call (zero past num_rows),
  and the conv windows [B, R - first, C, K-1] after rows first..R-1, first = max(R - cap - 1, 0).
  """
  R = xbc.shape[1]
  body = max(R - cfg.capacity, 0)
  RT = body + dual.tile_rows(cfg.capacity)
  post, _ = conv_prefill(cfg, params, conv0, xbc)
  dtp = rowmath.process_dt(dt.astype(f32), params.dt_bias, cfg.dt_limit)
  live = (jnp.arange(R)[None, :] < n[:, None])[..., None]
  pad = [(0, 0), (0, RT - R), (0, 0)]
  post = jnp.pad(jnp.where(live, post, 0.0), pad)
  dtp = jnp.pad(jnp.where(live, dtp, 0.0), pad)
  K1 = cfg.d_conv - 1
  raw = jnp.concatenate([jnp.swapaxes(conv0, 1, 2).astype(f32), xbc.astype(f32)], axis=1)
  wins = jnp.stack([raw[:, i + 1:i + 1 + K1] for i in range(max(body - 1, 0), R)], axis=1)
  return post, dtp, jnp.swapaxes(wins, 2, 3)


def _call_rows(cfg, params, S, conv0, xbc, dt, z, n, state_dtype, slots: bool):
  """A call's R rows from S [B, H, P, N] in the SSM kernel's segments.

  Returns (y [B, R, H*P] f32, the state after the body (S without one), with `slots` the states
  after the kept rows, the conv windows, post-conv rows, processed dt).
  """
  R = xbc.shape[1]
  cap, KT = cfg.capacity, dual.tile_rows(cfg.capacity)
  body = max(R - cap, 0)
  post, dtp, wins = _new_rows(cfg, params, conv0, xbc, dt, n)
  A, D = -jnp.exp(params.A_log), params.D
  Bsz = S.shape[0]
  kt = jnp.arange(KT)

  def segment(S, t0, L):
    """y of rows t0 .. t0 + L - 1 [B, L, H*P] from S, and the state after each row."""
    x, bm, cm, d = _split_rows(cfg, _tile(post, t0, KT), _tile(dtp, t0, KT))
    live = (kt[None, :] < L) & (t0 + kt[None, :] < n[:, None])
    y = _outputs_all(S, x, bm, cm, d, A, D, live)                           # [B, H, P, KT]
    y = jnp.transpose(y, (0, 3, 1, 2))[:, :L].reshape(Bsz, L, cfg.d_inner)
    sw = lambda a: jnp.swapaxes(a, 1, 2)[:, :L]                              # [B, L, H, ...]
    S, all_states = _advance(params, S, sw(x), sw(bm), jnp.swapaxes(d, 1, 2)[:, :L],
                             live[:, :L])
    return S, y, all_states

  ys = []
  full = body // cap
  if full:
    def loop(S, j):
      S, y, _ = segment(S, j * cap, cap)
      return S, y
    S, yb = lax.scan(loop, S, jnp.arange(full))
    ys.append(jnp.swapaxes(yb, 0, 1).reshape(Bsz, full * cap, cfg.d_inner))
  if body % cap:
    S, y, _ = segment(S, full * cap, body % cap)
    ys.append(y)
  if body:
    S = round_state(S, state_dtype)
  _, y, states = segment(S, body, min(R, cap))
  ys.append(y)
  y = jnp.concatenate(ys, axis=1)
  if z is not None:
    y = rowmath.gate(y, z.astype(f32))
  y = jnp.where((jnp.arange(R)[None, :] < n[:, None])[..., None], y, 0.0)
  return y, S, states if slots else None, wins, post, dtp


def snapshot_call(cfg, params, state: SnapshotState, args: status.CallArgs):
  """Snapshot-mode call of `args`. Returns (y in xbc.dtype, SnapshotState)."""
  E, S = state.ssm.shape[:2]
  xbc, dt, z, state_row = args.xbc, args.dt, args.z, args.state_row
  idx, n = args.cache_indices, args.num_rows
  R = xbc.shape[1]
  safe = status.safe_entry(idx, E)
  valid, pad, _ = status.sequence_status(False, S, E, R, idx, state_row, n, None)
  srow = jnp.where(status.row_ok(False, S, state_row, None), state_row, 0)
  keep = min(R, S)
  body = R - keep
  y, _, states, wins, _, _ = _call_rows(cfg, params, state.ssm[safe, srow].astype(f32),
                                        state.conv[safe, srow], xbc, dt, z, n,
                                        state.ssm.dtype, slots=True)
  ran = (body + jnp.arange(keep))[None, :] < n[:, None]
  cur_ssm, cur_conv = state.ssm[safe, :keep], state.conv[safe, :keep]
  new_ssm = jnp.where(ran[:, :, None, None, None], states.astype(cur_ssm.dtype), cur_ssm)
  new_conv = jnp.where(ran[:, :, None, None], wins[:, -keep:].astype(cur_conv.dtype), cur_conv)
  ssm = _scatter(state.ssm, idx, valid, jnp.concatenate([new_ssm, state.ssm[safe, keep:]], 1))
  conv = _scatter(state.conv, idx, valid,
                  jnp.concatenate([new_conv, state.conv[safe, keep:]], 1))
  return finish_y(y, valid, pad, xbc.dtype), SnapshotState(ssm=ssm, conv=conv)


def _tree_outputs_one(S, x, b, c, dt, A, D, valid, bits):
  a = jnp.where(valid, dt * A, 0.0)
  KT = x.shape[0]
  cum = dual.path_decay([a[k] for k in range(KT)], bits)
  return dual.outputs([S], x, [b], [c], dt, A, D, valid, _PRODUCTS, cum,
                      anc=dual.ancestors(bits, KT))


# vmapped over heads, then sequences (each with its own tree): y [B, H, P, KT].
_tree_outputs_all = jax.vmap(jax.vmap(_tree_outputs_one, in_axes=(0, 0, 0, 0, 0, 0, 0, None, None)),
                             in_axes=(0, 0, 0, 0, 0, None, None, 0, 0))


def _tree_rows(cfg, params, ssm0, conv0, xbc, dt, z, n, parents):
  """A draft tree's rows from ssm0 [B, H, P, N] f32 and conv0 [B, C, K-1]: (y [B, R, H*P] f32
  over each row's ancestors, post-conv rows [B, KT, C] and processed dt [B, KT, H] (zero past
  num_rows), the conv window after each row [B, R, C, K-1], the rows' ancestor bits [B, R]
  int32)."""
  Bsz, R = xbc.shape[:2]
  KT = dual.tile_rows(cfg.capacity)
  post, wins = tree.conv_rows(cfg, params, conv0, xbc, parents)
  live = jnp.arange(R)[None, :] < n[:, None]                                 # [B, R]
  dtp = rowmath.process_dt(dt.astype(f32), params.dt_bias, cfg.dt_limit)
  pad_rows = [(0, 0), (0, KT - R), (0, 0)]
  post = jnp.pad(jnp.where(live[..., None], post, 0.0), pad_rows)
  dtp = jnp.pad(jnp.where(live[..., None], dtp, 0.0), pad_rows)
  x, bm, cm, d = _split_rows(cfg, post, dtp)
  # Rows R..KT-1 (the tile's padding, never valid) have no ancestors.
  bits = tree.ancestor_bits(parents)                                         # [B, R]
  live_kt = jnp.pad(live, [(0, 0), (0, KT - R)])
  A = -jnp.exp(params.A_log)
  y = _tree_outputs_all(ssm0, x, bm, cm, d, A, params.D, live_kt,
                        jnp.pad(bits, [(0, 0), (0, KT - R)]))                   # [B, H, P, KT]
  y = jnp.transpose(y, (0, 3, 1, 2))[:, :R].reshape(Bsz, R, cfg.d_inner)
  if z is not None:
    y = rowmath.gate(y, z.astype(f32))
  return jnp.where(live[..., None], y, 0.0), post, dtp, wins, bits


def snapshot_tree_call(cfg, params, state: SnapshotState, args: status.CallArgs, parents):
  """Snapshot-mode call of a draft tree (`parents` [B, R], R <= capacity): y in the dual form
  over each row's ancestors, row r's state and conv window in slot r. Returns (y in xbc.dtype,
  SnapshotState)."""
  E, S = state.ssm.shape[:2]
  xbc, dt, z, state_row = args.xbc, args.dt, args.z, args.state_row
  idx, n = args.cache_indices, args.num_rows
  Bsz, R = xbc.shape[:2]
  if R > min(S, cfg.capacity):
    raise ValueError(f"parents: a tree call takes at most capacity={cfg.capacity} rows, got {R}")
  safe = status.safe_entry(idx, E)
  valid, pad, _ = status.sequence_status(False, S, E, R, idx, state_row, n, None)
  srow = jnp.where(status.row_ok(False, S, state_row, None), state_row, 0)
  ssm0, conv0 = state.ssm[safe, srow].astype(f32), state.conv[safe, srow]
  parents = jnp.asarray(parents, jnp.int32)
  y, post, dtp, wins, _ = _tree_rows(cfg, params, ssm0, conv0, xbc, dt, z, n, parents)
  x, bm, _, d = _split_rows(cfg, post, dtp)
  live = jnp.arange(R)[None, :] < n[:, None]                                 # [B, R]

  def step(states, inp):                 # each row's state from its parent's
    t, xr, br, dr, par, act = inp
    st = tree.from_parent(states, ssm0, par)
    # A parent other than the row before: its slot, as stored (a 16-bit state rounds).
    reload = ((par >= 0) & (par != t - 1))[:, None, None, None]
    st = jnp.where(reload, round_state(st, state.ssm.dtype), st)
    dA = rowmath.decay(dr, params.A_log)[..., None, None]
    new = rowmath.state_update(st, dA, (dr[..., None] * xr)[..., None], br[..., None, :])
    return states.at[:, t].set(jnp.where(act[:, None, None, None], new, st)), None

  sw = lambda a: jnp.moveaxis(a, 2, 0)[:R]                                   # rows first
  states, _ = lax.scan(step, jnp.zeros((Bsz, R) + ssm0.shape[1:], f32),
                       (jnp.arange(R, dtype=jnp.int32), sw(x), sw(bm), sw(d),
                        jnp.swapaxes(parents, 0, 1), jnp.swapaxes(live, 0, 1)))
  cur_ssm, cur_conv = state.ssm[safe, :R], state.conv[safe, :R]
  new_ssm = jnp.where(live[:, :, None, None, None], states.astype(cur_ssm.dtype), cur_ssm)
  new_conv = jnp.where(live[:, :, None, None], wins.astype(cur_conv.dtype), cur_conv)
  ssm = _scatter(state.ssm, idx, valid, jnp.concatenate([new_ssm, state.ssm[safe, R:]], 1))
  conv = _scatter(state.conv, idx, valid, jnp.concatenate([new_conv, state.conv[safe, R:]], 1))
  return finish_y(y, valid, pad, xbc.dtype), SnapshotState(ssm=ssm, conv=conv)


def _window_status(cfg, state: CompactState, state_row, safe):
  """(rows_to_replay, the folded rows' `status.fold_path` mask or None where the pool does not
  walk paths, the accepted row's `last_bits` (0 with nothing pending), starts, pending,
  origin), each [B]."""
  starts, pending = state.starts[safe], state.pending[safe]
  first = status.last_call_start(starts)
  n_fold = status.rows_to_replay(cfg.window_rows, state_row, pending, jnp, first)
  path = row_bits = None
  if status.walks_paths(cfg):
    row = jnp.clip(state_row, 0, cfg.capacity - 1)
    row_bits = jnp.where(pending > 0, state.last_bits[safe, row], 0)
    path = status.fold_path(pending, first, row_bits)
  return n_fold, path, row_bits, starts, pending, state.origin[safe]


def fold(cfg, params, state: CompactState, state_row, safe):
  """Folds the pending rows on the path to `state_row` into the base (`status.fold_path`), as
  the SSM kernel does.

  Returns (ssm [B, H, P, N] f32 rounded as stored, conv [B, C, K-1] f32, rows_to_replay [B]
  int32, the fold's path mask [B] int32 or None).
  """
  n_fold, path, row_bits, starts, pending, origin = _window_status(cfg, state, state_row, safe)
  W = cfg.window_rows
  j = jnp.arange(W)[None, :]
  rows = status.ring_row(cfg, origin[:, None], j)                             # [B, W]
  take = lambda a: jnp.take_along_axis(a, rows[..., None], axis=1)
  x, bm, _, d = _split_rows(cfg, take(state.win_xb[safe]), take(state.win_dt[safe]))
  sw = lambda a: jnp.swapaxes(a, 1, 2)
  began = (((starts[:, None] >> j) & 1) > 0) & (j > 0) if cfg.deferred else None
  on = j < n_fold[:, None] if path is None else ((path[:, None] >> j) & 1) > 0
  if path is not None:
    # A tree row whose parent is not the row before it starts from the parent's state as
    # snapshot mode stores it: a 16-bit state rounds there too.
    gap = on & (j > 0) & ~jnp.roll(on, 1, axis=1)
    began = gap if began is None else began | gap
  S, _ = _advance(params, state.ssm[safe].astype(f32), sw(x), sw(bm), sw(d), on, began,
                  state.ssm.dtype)
  S = round_state(S, state.ssm.dtype)
  K1 = cfg.d_conv - 1
  raw = jnp.concatenate([jnp.swapaxes(state.conv[safe], 1, 2).astype(f32),
                         state.last_xbc[safe].astype(f32)], axis=1)           # [B, K1+cap, C]
  if row_bits is None:
    off = jnp.where(pending > 0, state_row + 1, 0)
    pos = jnp.clip(off[:, None] + jnp.arange(K1)[None, :], 0, raw.shape[1] - 1)
  else:                          # positions in raw of `status.path_taps`' entries
    pos = jnp.stack([jnp.where(r >= 0, K1 + r, q)
                     for q, r in status.path_taps(row_bits, K1)], axis=1)
  conv = jnp.swapaxes(jnp.take_along_axis(raw, pos[..., None], axis=1), 1, 2)
  return S, conv, n_fold, path


def compact_call(cfg, params, state: CompactState, args: status.CallArgs, parents=None):
  """Compact-replay call of `args`; `parents` [B, R] (R <= capacity) makes it a draft tree's
  (y over each row's ancestors, its rows kept pending with their `last_bits`). Returns (y in
  xbc.dtype, CompactState)."""
  E = state.ssm.shape[0]
  cap, Q = cfg.capacity, cfg.ring_rows
  xbc, dt, z, state_row = args.xbc, args.dt, args.z, args.state_row
  idx, n = args.cache_indices, args.num_rows
  Bsz, R, _ = xbc.shape
  safe = status.safe_entry(idx, E)
  valid, pad, n_fold = status.sequence_status(True, cap, E, R, idx, state_row, n,
                                              state.pending[safe], starts=state.starts[safe],
                                              W=cfg.window_rows)
  ssm0, conv0, _, path = fold(cfg, params, state, state_row, safe)
  starts, origin = state.starts[safe], state.origin[safe]
  flush = status.flushes(cfg, R, n_fold, n, path=path)
  _, new_pending, new_starts = status.window_after(cfg, R, n_fold, n, starts, flush)
  body = max(R - cap, 0)
  if parents is None:
    y, S_body, _, wins, post, dtp = _call_rows(cfg, params, ssm0, conv0, xbc, dt, z, n,
                                               state.ssm.dtype, slots=False)
    bits = status.chain_bits(jnp.arange(R - body, dtype=jnp.int32))[None, :]
  else:
    if R > cap:
      raise ValueError(f"parents: a tree call takes at most capacity={cap} rows, got {R}")
    parents = jnp.asarray(parents, jnp.int32)
    y, post, dtp, _, bits = _tree_rows(cfg, params, ssm0, conv0, xbc, dt, z, n, parents)
  base = S_body if body else ssm0
  conv_base = wins[:, 0] if body else conv0            # the window after row body - 1
  # Kept row i goes to last_xbc row i - body and ring row ring_row(origin, n_fold + i - body).
  nk = R - body
  kept = jnp.arange(body, R)[None, :] < n[:, None]                          # [B, nk]
  cur = state.last_xbc[safe]
  last = jnp.concatenate([jnp.where(kept[..., None], xbc[:, body:].astype(cur.dtype),
                                    cur[:, :nk]), cur[:, nk:]], axis=1)
  cur_bits = state.last_bits[safe]
  if status.walks_paths(cfg):        # else the leaf is not used, and left as it is
    last_bits = jnp.concatenate([jnp.where(kept, bits, cur_bits[:, :nk]), cur_bits[:, nk:]],
                                axis=1)
  else:
    last_bits = cur_bits
  ring = status.ring_row(cfg, origin[:, None], n_fold[:, None] + jnp.arange(nk)[None, :])
  target = jnp.where(kept, ring, Q)                                         # Q: dropped
  b_idx = jnp.arange(Bsz)[:, None]
  XB = cfg.d_inner + cfg.ngroups * cfg.dstate
  win_xb = state.win_xb[safe].at[b_idx, target].set(
      post[:, body:R, :XB].astype(state.win_xb.dtype), mode="drop")
  win_dt = state.win_dt[safe].at[b_idx, target].set(dtp[:, body:R], mode="drop")
  keep_base = flush.reshape((-1, 1, 1, 1))
  new_state = CompactState(
      ssm=_scatter(state.ssm, idx, valid,
                   jnp.where(keep_base, base.astype(state.ssm.dtype), state.ssm[safe])),
      conv=_scatter(state.conv, idx, valid, conv_base),
      last_xbc=_scatter(state.last_xbc, idx, valid, last),
      win_xb=_scatter(state.win_xb, idx, valid, win_xb),
      win_dt=_scatter(state.win_dt, idx, valid, win_dt),
      pending=_scatter(state.pending, idx, valid, new_pending),
      starts=_scatter(state.starts, idx, valid, new_starts),
      origin=_scatter(state.origin, idx, valid, status.ring_origin(cfg, origin, n_fold, flush)),
      last_bits=_scatter(state.last_bits, idx, valid, last_bits),
  )
  return finish_y(y, valid, pad, xbc.dtype), new_state


def committed_state(cfg, params, state, args: status.CallArgs):
  """The committed (ssm [B, H, P, N] f32, conv [B, C, K-1]) at `args.state_row` (a fold's
  args: R = 0), either mode; zeros for padding, NaN for invalid rows or entries.
  """
  E = state.ssm.shape[0]
  state_row, idx = args.state_row, args.cache_indices
  safe = status.safe_entry(idx, E)
  compact = isinstance(state, CompactState)
  pending = state.pending[safe] if compact else None
  starts = state.starts[safe] if compact else None
  ok, pad, _ = status.sequence_status(compact, cfg.capacity, E, 0, idx, state_row,
                                      args.num_rows, pending, starts=starts, W=cfg.window_rows)
  if not compact:
    srow = jnp.where(ok, state_row, 0)
    ssm, conv = state.ssm[safe, srow].astype(f32), state.conv[safe, srow]
  else:
    ssm, conv, _, _ = fold(cfg, params, state, state_row, safe)
    conv = conv.astype(state.conv.dtype)
  return mask_invalid(ssm, ok, pad), mask_invalid(conv, ok, pad)


def mask_invalid(a, ok, pad):
  """a with padding rows set to 0 and other invalid rows to NaN (dtype kept)."""
  shape = (-1,) + (1,) * (a.ndim - 1)
  fill = jnp.where(pad, 0.0, jnp.nan).reshape(shape)
  return jnp.where(ok.reshape(shape), a, fill).astype(a.dtype)



def conv_prefill(cfg, params, conv0, xbc):
  """Causal conv over a chunk: post-conv [B, R, C] and final conv state [B, C, K-1], float32.

  Each tap's window is its own join of [conv0 rows; xbc rows], which XLA fuses into the conv.
  """
  K = cfg.d_conv
  R = xbc.shape[1]
  common = jnp.promote_types(conv0.dtype, xbc.dtype)
  head = jnp.swapaxes(conv0, 1, 2).astype(common)                   # [B, K-1, C]
  xs = xbc.astype(common)

  def rows(start, n):                   # rows start..start+n-1 of [head; xs]
    parts = [head[:, start:min(start + n, K - 1)]] if start < K - 1 else []
    lo, hi = max(start - (K - 1), 0), start + n - (K - 1)
    if hi > 0:
      parts.append(xs[:, lo:hi])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)

  window = [rows(k, R).astype(f32) for k in range(K)]               # each [B, R, C]
  taps = [params.conv_weight[:, k] for k in range(K)]
  out = rowmath.conv_output(taps, window, params.conv_bias, xbc.dtype)
  return out, conv_state_after(cfg, conv0, xbc)


def conv_state_after(cfg, conv0, xbc):
  """The conv state [B, C, K-1] f32 after rows xbc [B, R, C] from conv0: the last K-1 raw rows."""
  K, R = cfg.d_conv, xbc.shape[1]
  common = jnp.promote_types(conv0.dtype, xbc.dtype)
  last = jnp.concatenate([jnp.swapaxes(conv0, 1, 2).astype(common),
                          xbc[:, max(R - (K - 1), 0):].astype(common)], axis=1)[:, -(K - 1):]
  return jnp.swapaxes(last, 1, 2).astype(f32)

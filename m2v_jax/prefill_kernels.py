"""Chunked (SSD) prefill: Pallas kernels for the bulk of a long chunk, then the serial tail.

A prefill call of R > capacity rows is split the same way in both modes: rows 0..R-cap-1
("the body") run through the chunked scan below, the last `cap` rows through the serial
verify kernels (snapshot: their S snapshots; compact: they become the pending window). The
split is the same in both modes and the body starts from bitwise the same state (snapshot:
slot `state_row`; compact: the base after the pre-pass fold), so the modes stay bitwise
identical across a prefill.

The body:
1. conv and dt processing for all body rows at once, in XLA (`reference.conv_prefill`,
   `rowmath.process_dt`, the same per-element code as the kernels), padded to a multiple of
   the chunk length L with rows that have x = B = C = 0 and dt = 0 (no decay, no input);
2. the chunked scan: an XLA einsum and two kernels. Per chunk of L rows (Mamba-2 paper, §6,
   the SSD algorithm), with acum = cumsum(dt * A) the log decay from the chunk start:
     y     = (C Bᵀ ∘ exp(acum_t - acum_s) ∘ [s <= t] ∘ dt_s) x       intra-chunk
           + exp(acum_t) · C stateᵀ + D x                            from the carried state
     state = exp(acum_L) · state + (x ∘ exp(acum_L - acum_s) dt_s)ᵀ B
   C Bᵀ is the same for every head of a group: one XLA einsum (`group_cb`) computes it per
   chunk and group. Pass 1 (`_chunk_local_kernel`, grid (chunks, H x P tiles, B)) computes
   every chunk's terms that do not depend on the carried state at once: the intra-chunk y
   and the chunk's own state (its last line's second term), into float32 scratch. Pass 2
   (`_chunk_pass_kernel`, grid (P / block_p, H, B)) keeps a [block_p, N] state tile in
   registers and walks the chunks in order: one small matmul (C stateᵀ) and an elementwise
   update per chunk. The matmuls run on the tensor cores with 3-pass TF32
   (`_backend.DOT_PRECISION`, about float32 accuracy); the final state is written over the
   starting slot or base;
3. the conv state after the body (its last K-1 raw inputs) is written over the same place.
Then the serial kernels run the last `cap` rows from there.

Scratch per sequence (float32, Rp body rows padded to the chunk length L): post-conv rows
Rp·C, C·Bᵀ (Rp/L)·G·L², intra-chunk y Rp·H·P, chunk states (Rp/L)·H·P·N; at Bolt geometry
and R = 4096 about 168 + 8 + 134 + 268 MB = 0.58 GB, linear in B: callers prefilling many
long prompts at once should split the batch.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import _backend
from m2v_jax import config as config_lib
from m2v_jax import reference
from m2v_jax import rowmath
from m2v_jax import verify_kernels
from m2v_jax.state import CompactState, SnapshotState

f32 = jnp.float32

MIN_ROWS = 64        # body rows from which `prefill` picks the chunked kernel by default


def supported(cfg: config_lib.Mamba2Config) -> bool:
  """Whether the compiled chunked scan takes this geometry: its dots need every dimension
  >= 16 (the smallest Triton dot), so headdim needs a power-of-two divisor >= 16 (its P
  tiles) and dstate >= 16 (a power of two, as for every kernel)."""
  return config_lib.pow2_divisor(cfg.headdim, 64) >= 16 and cfg.dstate >= 16


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """Static description of a chunked-scan launch.

  Attributes:
    cfg: geometry and mode.
    Rp: body rows, padded to a multiple of `chunk`.
    E, B: pool entries, sequences.
    has_z: gate.
    y_dtype: activation dtype.
    tiles: launch parameters (`config.ChunkTiles`).
    interpret: Pallas interpret mode.
  """

  cfg: config_lib.Mamba2Config
  Rp: int
  E: int
  B: int
  has_z: bool
  y_dtype: jnp.dtype
  tiles: config_lib.ChunkTiles
  interpret: bool = False

  @property
  def chunk(self) -> int:
    return self.tiles.chunk

  @property
  def block_p(self) -> int:
    """P rows per state-passing program: the tiles' block_p, shrunk to divide headdim."""
    return config_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def local_block_p(self) -> int:
    """P rows per chunk-local program: all of P up to 64, in power-of-two tiles."""
    return config_lib.pow2_divisor(self.cfg.headdim, 64)


def _chunk_local_kernel(go_ref, xr_ref, dtr_ref, cb_ref, alog_ref, yin_ref, s_ref, *,
                        plan: ChunkPlan):
  """Pass 1, grid (chunks, H x P / local_block_p, B), every chunk at once: the intra-chunk
  output (C Bᵀ ∘ decay ∘ dt) x into `yin` [B, Rp, H*P] f32 and the chunk's state from a
  zero start, (x ∘ exp(acum_L - acum) dt)ᵀ B, into `s` [B, chunks, H, P, N] f32. C Bᵀ is per group and
  chunk (`cb` [B, chunks, G, L, L] f32, one XLA einsum for all heads)."""
  cfg = plan.cfg
  P, N = cfg.headdim, cfg.dstate
  HP, L, BP = cfg.d_inner, plan.chunk, plan.local_block_p
  c, hp, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  h, pid_p = hp // (P // BP), hp % (P // BP)
  g = h // cfg.heads_per_group
  rows = pl.ds(c * L, L)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  dot = lambda a, b_, **kw: _backend.dot(a, b_, interpret=plan.interpret, **kw)

  @pl.when(go_ref[b] > 0)
  def _run():
    x = xr_ref[b, rows, xcols]                                   # [L, BP]
    bm = xr_ref[b, rows, pl.ds(HP + g * N, N)]                   # [L, N]
    dtv = dtr_ref[b, rows, h]                                    # [L]
    acum, acum_l = _log_decay(dtv, -jnp.exp(alog_ref[h]), L)
    t_idx = lax.broadcasted_iota(jnp.int32, (L, L), 0)
    s_idx = lax.broadcasted_iota(jnp.int32, (L, L), 1)
    causal = t_idx >= s_idx
    seg = jnp.where(causal, acum[:, None] - acum[None, :], 0.0)
    w_ts = jnp.where(causal, jnp.exp(seg), 0.0) * dtv[None, :]
    yin_ref[b, rows, xcols] = dot(cb_ref[b, c, g, :, :] * w_ts, x)
    w_s = jnp.exp(acum_l - acum) * dtv                           # [L]
    s_ref[b, c, h, pl.ds(pid_p * BP, BP), :] = dot(x * w_s[:, None], bm, trans_a=True)


def group_cb(cfg, xr, chunk: int, interpret: bool):
  """C·Bᵀ of every chunk and group: [B, chunks, G, L, L] float32 from the post-conv rows
  `xr` [B, Rp, C], one batched matmul at the scan's precision (`_backend.precision`)."""
  Bsz, Rp, _ = xr.shape
  G, N, HP = cfg.ngroups, cfg.dstate, cfg.d_inner
  nc = Rp // chunk
  bm = xr[..., HP:HP + G * N].reshape(Bsz, nc, chunk, G, N)
  cm = xr[..., HP + G * N:HP + 2 * G * N].reshape(Bsz, nc, chunk, G, N)
  return jnp.einsum("bctgn,bcsgn->bcgts", cm, bm, precision=_backend.precision(interpret),
                    preferred_element_type=f32)


def _log_decay(dtv, a_h, L):
  """(acum [L] = cumsum(dt * A) from the chunk start, acum[L-1]): one formula for both
  passes (their summation order may differ with their warps: float32 rounding apart)."""
  acum = jnp.cumsum(dtv * a_h)
  last = lax.broadcasted_iota(jnp.int32, (L,), 0) == L - 1
  return acum, jnp.sum(jnp.where(last, acum, 0.0))            # acum[L-1], without a slice


def _chunk_pass_kernel(*refs, plan: ChunkPlan):
  """Pass 2, grid (P / block_p, H, B), chunks in order: from the starting state, each chunk
  adds C stateᵀ scaled by exp(acum) and D x to its intra-chunk output (and the gate), then
  passes the state on: state = exp(acum_L) state + the chunk's own state."""
  cfg = plan.cfg
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  BP, L = plan.block_p, plan.chunk
  compact = cfg.replay_mode == config_lib.COMPACT
  refs = list(refs)
  idx_ref, slot_ref, go_ref, xr_ref, dtr_ref, yin_ref, s_ref = refs[:7]
  del refs[:7]
  z_ref = refs.pop(0) if plan.has_z else None
  alog_ref, d_ref, ssm_in, ssm_out, y_ref = refs

  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  e = jnp.maximum(idx_ref[b], 0)
  g = h // cfg.heads_per_group
  ps = pl.ds(pid_p * BP, BP)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  ccols = pl.ds(HP + GN + g * N, N)
  a_h = -jnp.exp(alog_ref[h])
  d_h = d_ref[h]

  @pl.when(go_ref[b] > 0)
  def _run():
    if compact:
      st = ssm_in[e, h, ps, :]
    else:
      st = ssm_in[e, slot_ref[b], h, ps, :]

    def chunk(c, st):
      rows = pl.ds(c * L, L)
      x = xr_ref[b, rows, xcols]                                 # [L, BP]
      cm = xr_ref[b, rows, ccols]                                # [L, N]
      acum, acum_l = _log_decay(dtr_ref[b, rows, h], a_h, L)
      cst = _backend.dot(cm, st, trans_b=True, interpret=plan.interpret)   # C stateᵀ
      y = yin_ref[b, rows, xcols] + jnp.exp(acum)[:, None] * cst + d_h * x
      if plan.has_z:
        y = rowmath.gate(y, z_ref[b, rows, xcols].astype(f32))
      y_ref[b, rows, xcols] = y.astype(y_ref.dtype)
      return jnp.exp(acum_l) * st + s_ref[b, c, h, ps, :]

    st = lax.fori_loop(0, plan.Rp // L, chunk, st)
    if compact:
      ssm_out[e, h, ps, :] = st
    else:
      ssm_out[e, slot_ref[b], h, ps, :] = st


def chunk_scan_call(plan: ChunkPlan):
  """The chunked scan (both passes) as a function of arrays:
  `(cache_indices, slot, go, xr, dtr, [z], A_log, D, ssm) -> (ssm, y)`."""
  cfg = plan.cfg
  H, P, N, E, S = cfg.nheads, cfg.headdim, cfg.dstate, plan.E, cfg.capacity
  nc = plan.Rp // plan.chunk
  compact = cfg.replay_mode == config_lib.COMPACT
  sds = jax.ShapeDtypeStruct
  ssm_shape = sds((E, H, P, N), f32) if compact else sds((E, S, H, P, N), f32)
  L = plan.chunk
  local = _backend.pallas_call(
      lambda *refs: _chunk_local_kernel(*refs, plan=plan),
      grid=(nc, H * (P // plan.local_block_p), plan.B),
      out_shape=(sds((plan.B, plan.Rp, cfg.d_inner), f32), sds((plan.B, nc, H, P, N), f32)),
      input_output_aliases={}, num_warps=plan.tiles.local_warps, num_stages=1,
      interpret=plan.interpret, name=f"m2v_chunk_local_{cfg.replay_mode}")
  n_in = 7 + (1 if plan.has_z else 0) + 2
  passing = _backend.pallas_call(
      lambda *refs: _chunk_pass_kernel(*refs, plan=plan),
      grid=(P // plan.block_p, H, plan.B),
      out_shape=(ssm_shape, sds((plan.B, plan.Rp, cfg.d_inner), plan.y_dtype)),
      input_output_aliases={n_in: 0},
      num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages, interpret=plan.interpret,
      name=f"m2v_chunk_pass_{cfg.replay_mode}")

  def run(idx, slot, go, xr, dtr, *rest):
    zs = rest[:1] if plan.has_z else ()
    a_log, d, ssm = rest[len(zs):]
    cb = group_cb(cfg, xr, L, plan.interpret)
    yin, s = local(go, xr, dtr, cb, a_log)
    return passing(idx, slot, go, xr, dtr, yin, s, *zs, a_log, d, ssm)

  return run


def body_inputs(cfg, params, conv0, xbc, dt, Rp):
  """Post-conv rows [B, Rp, C] f32 and processed dt [B, Rp, H] f32 of the body, zero-padded
  (padded rows: x = B = C = 0, dt = 0), and the conv state after the body."""
  R = xbc.shape[1]
  post, conv_end = reference.conv_prefill(cfg, params, conv0, xbc)
  dtp = rowmath.process_dt(dt.astype(f32), params.dt_bias, cfg.dt_limit)
  pad = [(0, 0), (0, Rp - R), (0, 0)]
  return jnp.pad(post, pad), jnp.pad(dtp, pad), conv_end


def chunked_call(cfg, backend, params, state, xbc, dt, state_row, z, cache_indices,
                 kernel_call, fold_kernel,
                 tiles: config_lib.ChunkTiles | None = None):
  """A prefill call whose body runs through the chunked scan (see the module docstring).

  `kernel_call` runs the serial kernels (ops._kernel_call); `fold_kernel` the compact pre-pass;
  `tiles` overrides the chunk-tile table (`config.chunk_tile_config`).
  """
  B, R, _ = xbc.shape
  cap = cfg.capacity
  E = state.ssm.shape[0]
  interpret = backend == config_lib.INTERPRET
  compact = isinstance(state, CompactState)
  tiles = tiles or config_lib.chunk_tile_config(cfg)
  chunk = tiles.chunk
  Rb = R - cap
  if Rb <= 0:
    raise ValueError(f"chunked prefill: needs R > capacity ({cap}), got R={R}")
  Rp = -(-Rb // chunk) * chunk
  safe, valid, _ = verify_kernels.entry_status(cfg, state, state_row, R, cache_indices)
  if compact:
    state = fold_kernel(cfg, backend, params, state, state_row, cache_indices)
    conv0 = state.conv[safe]
    tail_row = jnp.where(valid, 0, -1).astype(jnp.int32)
  else:
    slot = jnp.where(valid, state_row, 0)
    conv0 = state.conv[safe, slot]
    tail_row = state_row
  post, dtp, conv_end = body_inputs(cfg, params, conv0, xbc[:, :Rb], dt[:, :Rb], Rp)
  has_z = z is not None
  zb = [jnp.pad(z[:, :Rb], [(0, 0), (0, Rp - Rb), (0, 0)])] if has_z else []
  plan = ChunkPlan(cfg=cfg, Rp=Rp, E=E, B=B, has_z=has_z, y_dtype=jnp.dtype(xbc.dtype),
                   tiles=tiles, interpret=interpret)
  ssm, y_body = chunk_scan_call(plan)(
      cache_indices, state_row, valid.astype(jnp.int32), post, dtp, *zb, params.A_log,
      params.D, state.ssm)
  target = jnp.where(valid, cache_indices, E)              # invalid: dropped
  if compact:
    conv = state.conv.at[target].set(conv_end.astype(state.conv.dtype), mode="drop")
    state = state._replace(ssm=ssm, conv=conv)
  else:
    conv = state.conv.at[target, jnp.where(valid, state_row, 0)].set(
        conv_end.astype(state.conv.dtype), mode="drop")
    state = SnapshotState(ssm=ssm, conv=conv)
  tail = slice(Rb, R)
  y_tail, state = kernel_call(cfg, backend, params, state, xbc[:, tail], dt[:, tail], tail_row,
                              None if z is None else z[:, tail], cache_indices,
                              jnp.full((B,), cap, jnp.int32))
  y_body = reference.finish_y(y_body[:, :Rb], valid, cache_indices == -1, xbc.dtype)
  return jnp.concatenate([y_body, y_tail], axis=1), state

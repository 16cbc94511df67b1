"""The chunked (SSD) scan of a prefill's body (docs/design.md, "The chunked prefill")."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import config as config_lib
from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib

f32 = jnp.float32

# Bodies of up to this many rows get chunks of at most this many (`ChunkPlan.chunk`).
SHORT_BODY_CHUNK = 64

# Chunk-parallel programs below which a program takes fewer heads (about four per H200 SM).
MIN_LOCAL_PROGRAMS = 512


def supported(cfg: config_lib.Mamba2Config) -> bool:
  """Whether the compiled chunked scan takes `cfg`: its dots need P tiles and dstate >= 16."""
  return tiles_lib.pow2_divisor(cfg.headdim, 64) >= 16 and cfg.dstate >= 16


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """Static description of a chunked-scan launch: geometry, body rows Rb (R = Rb + capacity),
  pool entries E, sequences B, gate, activation dtype, `ChunkTiles`, interpret mode.

  Raises ValueError, compiled, for a chunk or local_block_p below 16, and for a chunk below K-1.
  """

  cfg: config_lib.Mamba2Config
  Rb: int
  E: int
  B: int
  has_z: bool
  y_dtype: jnp.dtype
  tiles: tiles_lib.ChunkTiles
  interpret: bool = False

  def __post_init__(self):
    if self.chunk < self.cfg.d_conv - 1:
      raise ValueError(f"chunked prefill: chunk {self.chunk} below the conv state's "
                       f"{self.cfg.d_conv - 1} rows")
    if not self.interpret and min(self.chunk, self.local_block_p) < 16:
      raise ValueError(f"chunked prefill: compiled dots need chunk and local_block_p >= 16, "
                       f"got {self.chunk}, {self.local_block_p}")

  @property
  def chunk(self) -> int:
    """Rows per chunk: the tiles', at most 64 for bodies of up to 64 rows."""
    return min(self.tiles.chunk, max(SHORT_BODY_CHUNK, tiles_lib.next_pow2(self.Rb)))

  @property
  def n_chunks(self) -> int:
    return self.Rp // self.chunk

  @property
  def Rp(self) -> int:
    """Body rows padded to a multiple of the chunk."""
    return -(-self.Rb // self.chunk) * self.chunk

  @property
  def block_p(self) -> int:
    """P rows per state-passing program, dividing headdim."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def local_block_p(self) -> int:
    """P rows per chunk-states and output program, dividing headdim."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.local_block_p)

  def _heads(self, wanted: int) -> int:
    """Heads per chunk-parallel program: `wanted`, dividing a group's heads, halved while the
    grid has fewer than MIN_LOCAL_PROGRAMS programs.
    """
    nh = tiles_lib.pow2_divisor(self.cfg.heads_per_group, wanted)
    per_head = (self.cfg.headdim // self.local_block_p) * self.n_chunks * self.B
    while nh > 1 and self.cfg.nheads // nh * per_head < MIN_LOCAL_PROGRAMS:
      nh //= 2
    return nh

  @property
  def state_heads(self) -> int:
    return self._heads(self.tiles.state_heads)

  @property
  def out_heads(self) -> int:
    return self._heads(self.tiles.out_heads)

  @property
  def conv_rows(self) -> int:
    """Rows per conv program: at least K-1, at most the chunk."""
    return min(max(self.tiles.conv_rows, tiles_lib.next_pow2(self.cfg.d_conv - 1)),
               self.chunk)

  @property
  def conv_cols(self) -> int:
    """Channels per conv program, dividing conv_dim."""
    return tiles_lib.pow2_divisor(self.cfg.conv_dim, self.tiles.conv_cols)

  @property
  def R(self) -> int:
    """Rows of the call: the body, then the capacity rows of the verify tail."""
    return self.Rb + self.cfg.capacity

  @property
  def precision(self) -> str:
    """"highest", "tf32" or "bf16" (`Mamba2Config.prefill_precision_for`)."""
    return self.cfg.prefill_precision_for(self.y_dtype)

  @property
  def y_rows(self) -> int:
    """Rows of y: max(Rp, R), so the verify tail's y is written into it in place."""
    return max(self.Rp, self.R)


def scratch_bytes(plan: ChunkPlan) -> int:
  """Bytes of the chunked body's intermediate buffers, all sequences of the call."""
  cfg, nc, B = plan.cfg, plan.n_chunks, plan.B
  H = cfg.nheads
  return B * (plan.Rp * cfg.conv_dim * jnp.dtype(plan.y_dtype).itemsize
              + 4 * (plan.Rp * H + nc * cfg.ngroups * plan.chunk ** 2
                     + 2 * nc * H * cfg.headdim * cfg.dstate + nc * H))


def _log_decay(dtv, a_h, L):
  """(acum [L] = cumsum(dt * A) from the chunk start, acum[L-1])."""
  acum = jnp.cumsum(dtv * a_h)
  last = lax.broadcasted_iota(jnp.int32, (L,), 0) == L - 1
  return acum, jnp.sum(jnp.where(last, acum, 0.0))            # acum[L-1], without a slice


def _head_grid(plan: ChunkPlan, nh: int):
  """(first head, P tile) of program id 0 in a chunk-parallel grid, P tiles fastest (L2 reuse)."""
  P, BP = plan.cfg.headdim, plan.local_block_p
  hp = pl.program_id(0)
  return (hp // (P // BP)) * nh, hp % (P // BP)


def _for_heads(nh: int, head):
  """`head(j, carry)` for j < nh: a fori_loop (pipelined loads), or one call for nh = 1."""
  if nh == 1:
    head(0, 0)
  else:
    lax.fori_loop(0, nh, head, 0)


def _chunk_states_kernel(*, valid_ref, rb_ref, xr_ref, dtr_ref, alog_ref, s_ref, dec_ref,
                         plan: ChunkPlan):
  """Chunk states from a zero start, grid (H / state_heads * P / local_block_p, chunks, B).

    valid_ref, rb_ref [B] int32: 1 if the sequence runs, body rows
    xr_ref [B, Rp, C]; dtr_ref [B, Rp, H] f32
    s_ref   [B, chunks, H, P, N] f32   (x * exp(acum_L - acum) dt)ᵀ B
    dec_ref [B, chunks, H] f32         exp(acum_L)
  """
  cfg = plan.cfg
  P, N = cfg.headdim, cfg.dstate
  HP, L, BP, NH = cfg.d_inner, plan.chunk, plan.local_block_p, plan.state_heads
  c, b = pl.program_id(1), pl.program_id(2)
  h0, pid_p = _head_grid(plan, NH)
  g = h0 // cfg.heads_per_group
  rows = pl.ds(c * L, L)

  @pl.when((valid_ref[b] > 0) & (c * L < rb_ref[b]))
  def _run():
    bm = xr_ref[b, rows, pl.ds(HP + g * N, N)]                   # [L, N] activation dtype

    def head(j, carry):
      h = h0 + j
      x = xr_ref[b, rows, pl.ds(h * P + pid_p * BP, BP)].astype(f32)   # [L, BP]
      dtv = dtr_ref[b, rows, h]                                  # [L]
      acum, acum_l = _log_decay(dtv, -jnp.exp(alog_ref[h]), L)
      w_s = jnp.exp(acum_l - acum) * dtv                         # [L]
      s_ref[b, c, h, pl.ds(pid_p * BP, BP), :] = backend.dot(
          x * w_s[:, None], bm, trans_a=True, precision=plan.precision,
          interpret=plan.interpret)
      dec_ref[b, c, h] = jnp.exp(acum_l)
      return carry

    _for_heads(NH, head)


def _chunk_pass_kernel(*, idx_ref, slot_ref, valid_ref, rb_ref, dec_ref, s_ref, ssm_ref,
                       ssm_out_ref, st_ref, plan: ChunkPlan):
  """State passing, grid (P / block_p, H, B): st = dec * st + s chunk by chunk, elementwise.

    ssm_ref: the pool's ssm leaf, aliased to ssm_out_ref (the final state).
    st_ref [B, chunks, H, P, N] f32: each chunk's starting state; not aliased to s_ref, so the
      next chunk's loads need not wait for this chunk's store.
  """
  cfg = plan.cfg
  BP = plan.block_p
  compact = cfg.compact
  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  e = jnp.maximum(idx_ref[b], 0)
  ps = pl.ds(pid_p * BP, BP)

  @pl.when(valid_ref[b] > 0)
  def _run():
    st = (ssm_ref[e, h, ps, :] if compact else ssm_ref[e, slot_ref[b], h, ps, :]).astype(f32)

    def chunk(c, st):
      own = s_ref[b, c, h, ps, :]
      st_ref[b, c, h, ps, :] = st
      return dec_ref[b, c, h] * st + own

    st = lax.fori_loop(0, (rb_ref[b] + plan.chunk - 1) // plan.chunk, chunk, st)
    st = st.astype(ssm_out_ref.dtype)
    if compact:
      ssm_out_ref[e, h, ps, :] = st
    else:
      ssm_out_ref[e, slot_ref[b], h, ps, :] = st


def _chunk_out_kernel(*, valid_ref, rb_ref, fill_ref, xr_ref, dtr_ref, cb_ref, st_ref, z_ref=None,
                      alog_ref, d_ref, y_ref, plan: ChunkPlan):
  """y of every chunk, gated, grid (H / out_heads * P / local_block_p, chunks, B).

    cb_ref [B, chunks, G, L, L] f32 (C·Bᵀ); st_ref: starting states; fill_ref [B] f32: y of a
    sequence not run; y_ref [B, y_rows, H*P]: rows past the body are the verify tail's.
  """
  cfg = plan.cfg
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, L, BP, NH = cfg.d_inner, plan.chunk, plan.local_block_p, plan.out_heads
  c, b = pl.program_id(1), pl.program_id(2)
  h0, pid_p = _head_grid(plan, NH)
  g = h0 // cfg.heads_per_group
  rows = pl.ds(c * L, L)
  dot = lambda a, b_, **kw: backend.dot(a, b_, precision=plan.precision,
                                        interpret=plan.interpret, **kw)

  live = c * L < rb_ref[b]

  @pl.when((valid_ref[b] > 0) & live)
  def _run():
    cb = cb_ref[b, c, g, :, :]                                   # [L, L]
    cm = xr_ref[b, rows, pl.ds(HP + G * N + g * N, N)]           # [L, N] activation dtype
    t_idx = lax.broadcasted_iota(jnp.int32, (L, L), 0)
    s_idx = lax.broadcasted_iota(jnp.int32, (L, L), 1)
    causal = t_idx >= s_idx

    def head(j, carry):
      h = h0 + j
      xcols = pl.ds(h * P + pid_p * BP, BP)
      x = xr_ref[b, rows, xcols].astype(f32)                     # [L, BP]
      dtv = dtr_ref[b, rows, h]                                  # [L]
      acum, _ = _log_decay(dtv, -jnp.exp(alog_ref[h]), L)
      seg = jnp.where(causal, acum[:, None] - acum[None, :], 0.0)
      w_ts = jnp.where(causal, jnp.exp(seg), 0.0) * dtv[None, :]
      y = dot(cb * w_ts, x) + d_ref[h] * x
      cst = dot(cm, st_ref[b, c, h, pl.ds(pid_p * BP, BP), :], trans_b=True)   # C stᵀ
      y = y + jnp.exp(acum)[:, None] * cst
      if plan.has_z:
        y = rowmath.gate(y, z_ref[b, rows, xcols].astype(f32))
      y_ref[b, rows, xcols] = y.astype(y_ref.dtype)
      return carry

    _for_heads(NH, head)

  @pl.when((valid_ref[b] == 0) | jnp.logical_not(live))
  def _fill():
    value = jnp.where(valid_ref[b] > 0, 0.0, fill_ref[b])
    tile = jnp.broadcast_to(value, (L, BP)).astype(y_ref.dtype)
    for j in range(NH):
      y_ref[b, rows, pl.ds((h0 + j) * P + pid_p * BP, BP)] = tile


def group_cb(cfg, xr, chunk: int, precision: str, interpret: bool):
  """C·Bᵀ [B, chunks, G, L, L] f32 of the post-conv rows `xr` [B, Rp, C], one batched matmul."""
  Bsz, Rp, _ = xr.shape
  G, N, HP = cfg.ngroups, cfg.dstate, cfg.d_inner
  nc = Rp // chunk
  bm = xr[..., HP:HP + G * N].reshape(Bsz, nc, chunk, G, N)
  cm = xr[..., HP + G * N:HP + 2 * G * N].reshape(Bsz, nc, chunk, G, N)
  return backend.einsum("bctgn,bcsgn->bcgts", cm, bm, precision=precision,
                        interpret=interpret)


def chunk_scan(plan: ChunkPlan, cache_indices, slot, valid, rb, fill, xr, dtr, z, A_log, D, ssm):
  """The chunked scan: `group_cb` and the three kernels.

  Args:
    plan: the launch.
    cache_indices, slot, valid, rb: [B] int32 entry, starting slot (snapshot), 1 if the
      sequence runs, body rows.
    fill: [B] float32 y of a sequence not run (NaN: rejected, 0: padding).
    xr, dtr: [B, Rp, C] post-conv rows, [B, Rp, H] float32 dt, both zero from rb on.
    z: optional [B, >= Rp, H*P] gate; A_log, D: [H] float32.
    ssm: the pool's ssm leaf; final states go over the starting slot or base in place.

  Returns:
    (ssm, y [B, y_rows, H*P] in the activation dtype; rows Rb.. left for the verify tail).
  """
  cfg, t = plan.cfg, plan.tiles
  H, P, N = cfg.nheads, cfg.headdim, cfg.dstate
  nc = plan.n_chunks
  sds = jax.ShapeDtypeStruct
  tiles_p = P // plan.local_block_p
  launch = lambda kernel, **kw: backend.pallas_call(
      lambda **refs: kernel(**refs, plan=plan), interpret=plan.interpret, **kw)
  own = launch(
      _chunk_states_kernel,
      inputs=dict(valid_ref=valid, rb_ref=rb, xr_ref=xr, dtr_ref=dtr, alog_ref=A_log),
      outputs=dict(s_ref=sds((plan.B, nc, H, P, N), f32), dec_ref=sds((plan.B, nc, H), f32)),
      grid=(H // plan.state_heads * tiles_p, nc, plan.B),
      num_warps=t.state_warps, num_stages=t.state_stages,
      name=f"m2v_chunk_states_{cfg.replay_mode}")
  passed = launch(
      _chunk_pass_kernel,
      inputs=dict(idx_ref=cache_indices, slot_ref=slot, valid_ref=valid, rb_ref=rb,
                  dec_ref=own["dec_ref"], s_ref=own["s_ref"], ssm_ref=ssm),
      outputs=dict(ssm_out_ref=sds(ssm.shape, ssm.dtype),
                   st_ref=sds((plan.B, nc, H, P, N), f32)),
      aliases=dict(ssm_ref="ssm_out_ref"),
      grid=(P // plan.block_p, H, plan.B), num_warps=t.num_warps, num_stages=t.num_stages,
      name=f"m2v_chunk_pass_{cfg.replay_mode}")
  cb = group_cb(cfg, xr, plan.chunk, plan.precision, plan.interpret)
  out = launch(
      _chunk_out_kernel,
      inputs=dict(valid_ref=valid, rb_ref=rb, fill_ref=fill, xr_ref=xr, dtr_ref=dtr, cb_ref=cb,
                  st_ref=passed["st_ref"], z_ref=z if plan.has_z else None, alog_ref=A_log,
                  d_ref=D),
      outputs=dict(y_ref=sds((plan.B, plan.y_rows, cfg.d_inner), plan.y_dtype)),
      grid=(H // plan.out_heads * tiles_p, nc, plan.B),
      num_warps=t.out_warps, num_stages=t.out_stages,
      name=f"m2v_chunk_out_{cfg.replay_mode}")
  return passed["ssm_out_ref"], out["y_ref"]

"""Chunked (SSD) prefill: Pallas kernels for the bulk of a long chunk, then the verify tail.

A prefill call of R > capacity rows is split the same way in both modes: rows 0..R-cap-1
("the body") run through the chunked scan below, the last `cap` rows through the
verify kernels (snapshot: their S snapshots; compact: they become the pending window). The
split is the same in both modes and the body starts from bitwise the same state (snapshot:
slot `state_row`; compact: the base after the pre-pass fold), so the modes stay bitwise
identical across a prefill. In a ragged prefill (`dispatch.chunked_call` with `num_rows`)
each sequence has its own body, `rb` [B] rows: its rows from rb on are zero (no decay, no
input) and the chunks wholly past them are skipped.

The body:
1. conv (`_conv_kernel`, a Pallas kernel, `rowmath.conv_output`) and dt processing (XLA,
   `rowmath.process_dt`) for all body rows at once, padded to a multiple of the chunk
   length L with rows that have x = B = C = 0 and dt = 0 (no decay, no input);
2. the chunked scan: an XLA einsum and three kernels. Per chunk of L rows (Mamba-2 paper,
   §6, the SSD algorithm), with acum = cumsum(dt * A) the log decay from the chunk start and
   st the state at the chunk's start:
     y     = (C Bᵀ ∘ exp(acum_t - acum_s) ∘ [s <= t] ∘ dt_s) x + D x   intra-chunk
           + exp(acum_t) · C stᵀ                                     from the carried state
     state = exp(acum_L) · st + (x ∘ exp(acum_L - acum_s) dt_s)ᵀ B    the next chunk's st
   C Bᵀ is the same for every head of a group: one XLA einsum (`group_cb`) computes it per
   chunk and group. Then
   a. chunk states (`_chunk_states_kernel`, grid (heads / state_heads x P tiles, chunks,
      B)): every chunk's own state from a zero start, the last line's second term, and
      its decay exp(acum_L), all chunks at once;
   b. state passing (`_chunk_pass_kernel`, grid (P / block_p, H, B)): elementwise, chunks in
      order: the state at each chunk's start, st = exp(acum_L) st + own state, into a
      buffer; the final state over the starting slot or base. No matmul on this serial
      path: it streams at copy bandwidth;
   c. output (`_chunk_out_kernel`, grid (heads / out_heads x P tiles, chunks, B)): y of
      every chunk at once from its starting state (the first two lines), gated, into a
      buffer of the call's rows; a sequence that does not run gets its fill value (NaN:
      rejected, zero: padding).
   The matmuls run on the tensor cores with products at the plan's precision
   (`Mamba2Config.prefill_precision`: 3-pass TF32, one TF32 pass or bf16 operands; float32
   accumulation). The verify tail's y goes into the output's buffer in place (when the
   padded body reaches past the call's rows, the buffer has the padded body's rows and is
   cut to R at the end: one copy of y, and z is padded);
3. the conv state after the body (its last K-1 raw inputs) is written over the same place.
Then the verify kernels run the last `cap` rows from there.

Scratch per sequence (Rp body rows padded to the chunk length L): post-conv rows Rp·C in the
activation dtype, C·Bᵀ (Rp/L)·G·L² float32, and the chunk states and chunk starting states
2·(Rp/L)·H·P·N float32; at Bolt geometry, R = 4096 and bf16 activations (128-row chunks)
about 84 + 17 + 2·134 MB = 0.37 GB, with float32 activations (64-row chunks) 168 + 8 +
2·268 MB = 0.71 GB (`scratch_bytes`); linear in B: callers prefilling many long prompts at
once should split the batch.
"""

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

# The longest chunk a body of at most this many rows gets (`ChunkPlan.chunk`).
SHORT_BODY_CHUNK = 64

# Chunk-parallel programs (chunk-states and output kernels) below which a program takes
# fewer heads: about four per SM of an H200 (132 SMs), so that short bodies keep the SMs busy.
MIN_LOCAL_PROGRAMS = 512


def supported(cfg: config_lib.Mamba2Config) -> bool:
  """Whether the compiled chunked scan takes this geometry: its dots need every dimension
  >= 16 (the smallest Triton dot), so headdim needs a power-of-two divisor >= 16 (its P
  tiles) and dstate >= 16 (a power of two, as for every kernel)."""
  return tiles_lib.pow2_divisor(cfg.headdim, 64) >= 16 and cfg.dstate >= 16


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """Static description of a chunked-scan launch.

  Attributes:
    cfg: geometry and mode.
    Rb: body rows (the call's rows less the capacity: R = Rb + capacity).
    E, B: pool entries, sequences.
    has_z: gate.
    y_dtype: activation dtype.
    tiles: launch parameters (`tiles.ChunkTiles`).
    interpret: Pallas interpret mode.

  Raises:
    ValueError: compiled (not interpret) with a chunk or chunk-parallel P tile below 16, the
      smallest Triton dot; a chunk shorter than the conv state (K-1 rows).
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
    """Rows per chunk: the tiles' chunk, but at most 64 for a body of up to 64 rows (a
    128-row chunk would pad it to 128; 64 is what short bodies were measured with)."""
    return min(self.tiles.chunk, max(SHORT_BODY_CHUNK, 1 << max(self.Rb - 1, 0).bit_length()))

  @property
  def n_chunks(self) -> int:
    return self.Rp // self.chunk

  @property
  def Rp(self) -> int:
    """Body rows padded to a multiple of the chunk length."""
    return -(-self.Rb // self.chunk) * self.chunk

  @property
  def block_p(self) -> int:
    """P rows per state-passing program: the tiles' block_p, shrunk to divide headdim."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.block_p)

  @property
  def local_block_p(self) -> int:
    """P rows per chunk-states and output program: the tiles' local_block_p, shrunk to
    divide headdim."""
    return tiles_lib.pow2_divisor(self.cfg.headdim, self.tiles.local_block_p)

  def _heads(self, wanted: int) -> int:
    """Heads per chunk-parallel program: `wanted`, shrunk to divide the heads of a group
    (a program's heads share its B or C rows and C·Bᵀ), then halved while the grid has
    fewer than `MIN_LOCAL_PROGRAMS` programs (short bodies: more, smaller programs keep
    the SMs busy)."""
    nh = tiles_lib.pow2_divisor(self.cfg.heads_per_group, wanted)
    per_head = (self.cfg.headdim // self.local_block_p) * self.n_chunks * self.B
    while nh > 1 and self.cfg.nheads // nh * per_head < MIN_LOCAL_PROGRAMS:
      nh //= 2
    return nh

  @property
  def state_heads(self) -> int:
    """Heads per chunk-states program (`_heads` of the tiles' state_heads)."""
    return self._heads(self.tiles.state_heads)

  @property
  def out_heads(self) -> int:
    """Heads per output program (`_heads` of the tiles' out_heads)."""
    return self._heads(self.tiles.out_heads)

  @property
  def conv_rows(self) -> int:
    """Rows per conv program: the tiles' conv_rows, at most the chunk (Rp is a multiple)
    and at least K-1 (only the first block reads the conv state's rows)."""
    return min(max(self.tiles.conv_rows,
                   1 << (self.cfg.d_conv - 2).bit_length()), self.chunk)

  @property
  def conv_cols(self) -> int:
    """Channels per conv program: the tiles' conv_cols, shrunk to divide conv_dim."""
    return tiles_lib.pow2_divisor(self.cfg.conv_dim, self.tiles.conv_cols)

  @property
  def R(self) -> int:
    """Rows of the call: the body, then the `capacity` rows of the verify tail."""
    return self.Rb + self.cfg.capacity

  @property
  def precision(self) -> str:
    """Products of the dots: "highest", "tf32" or "bf16" (`Mamba2Config.prefill_precision`,
    by default chosen by the activation dtype)."""
    return self.cfg.prefill_precision_for(self.y_dtype)

  @property
  def y_rows(self) -> int:
    """Rows of the output kernel's y: the padded body, at least the call's rows, so that
    the verify tail's y is written into it in place."""
    return max(self.Rp, self.R)


def scratch_bytes(plan: ChunkPlan) -> int:
  """Bytes of the chunked body's intermediate buffers (post-conv rows, processed dt, C·Bᵀ,
  chunk states and decays), all sequences of the call."""
  cfg, nc, B = plan.cfg, plan.n_chunks, plan.B
  H = cfg.nheads
  return B * (plan.Rp * cfg.conv_dim * jnp.dtype(plan.y_dtype).itemsize
              + 4 * (plan.Rp * H + nc * cfg.ngroups * plan.chunk ** 2
                     + 2 * nc * H * cfg.headdim * cfg.dstate + nc * H))


def _log_decay(dtv, a_h, L):
  """(acum [L] = cumsum(dt * A) from the chunk start, acum[L-1]): one formula for both
  chunk-parallel kernels (their summation order may differ with their warps: float32
  rounding apart)."""
  acum = jnp.cumsum(dtv * a_h)
  last = lax.broadcasted_iota(jnp.int32, (L,), 0) == L - 1
  return acum, jnp.sum(jnp.where(last, acum, 0.0))            # acum[L-1], without a slice


def _head_grid(plan: ChunkPlan, nh: int):
  """(program id 0 -> first head h0, P-tile index) of a chunk-parallel grid whose axis 0
  enumerates blocks of `nh` heads x P tiles, P tiles fastest (programs that run together
  read the same chunk's rows: L2 hits)."""
  P, BP = plan.cfg.headdim, plan.local_block_p
  hp = pl.program_id(0)
  return (hp // (P // BP)) * nh, hp % (P // BP)


def _for_heads(nh: int, head):
  """Runs `head(j, carry)` for the program's heads j = 0..nh-1: a fori_loop (Triton
  pipelines its loads over the heads), or one straight call for a single head."""
  if nh == 1:
    head(0, 0)
  else:
    lax.fori_loop(0, nh, head, 0)


def _chunk_states_kernel(*, go_ref, rb_ref, xr_ref, dtr_ref, alog_ref, s_ref, dec_ref,
                         plan: ChunkPlan):
  """Chunk states, grid (H / state_heads x P / local_block_p, chunks, B), every chunk at
  once: the chunk's own state from a zero start, (x ∘ exp(acum_L - acum) dt)ᵀ B, into `s`
  [B, chunks, H, P, N] f32, and its decay exp(acum_L) into `dec` [B, chunks, H] f32 (the
  programs of a head's P tiles write the same value). A program loops over `state_heads`
  heads of one group; the group's B rows are loaded once. Chunks wholly past the sequence's
  body (`rb` [B] rows) are skipped."""
  cfg = plan.cfg
  P, N = cfg.headdim, cfg.dstate
  HP, L, BP, NH = cfg.d_inner, plan.chunk, plan.local_block_p, plan.state_heads
  c, b = pl.program_id(1), pl.program_id(2)
  h0, pid_p = _head_grid(plan, NH)
  g = h0 // cfg.heads_per_group
  rows = pl.ds(c * L, L)

  @pl.when((go_ref[b] > 0) & (c * L < rb_ref[b]))
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


def _chunk_pass_kernel(*, idx_ref, slot_ref, go_ref, rb_ref, dec_ref, s_ref, ssm_ref,
                       ssm_out_ref, st_ref, plan: ChunkPlan):
  """State passing, grid (P / block_p, H, B), chunks in order, elementwise (no matmul on
  the serial path): from the starting state, st = dec · st + s per chunk; each chunk's
  starting state into `st` [B, chunks, H, P, N] f32, the final state over the starting
  slot (snapshot) or base (compact), over the chunks of the sequence's body (`rb` [B]
  rows). A sequence that does not run writes nothing. (`st` is
  its own buffer: written over `s` in place, the loop's loads of the next chunk could no
  longer be issued ahead of this chunk's store, and the kernel ran 4.7x slower.)"""
  cfg = plan.cfg
  BP = plan.block_p
  compact = cfg.compact
  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  e = jnp.maximum(idx_ref[b], 0)
  ps = pl.ds(pid_p * BP, BP)

  @pl.when(go_ref[b] > 0)
  def _run():
    st = (ssm_ref[e, h, ps, :] if compact else ssm_ref[e, slot_ref[b], h, ps, :]).astype(f32)

    def chunk(c, st):
      own = s_ref[b, c, h, ps, :]
      st_ref[b, c, h, ps, :] = st
      return dec_ref[b, c, h] * st + own

    st = lax.fori_loop(0, (rb_ref[b] + plan.chunk - 1) // plan.chunk, chunk, st)
    st = st.astype(ssm_out_ref.dtype)            # rounded when the state is stored in 16 bits
    if compact:
      ssm_out_ref[e, h, ps, :] = st
    else:
      ssm_out_ref[e, slot_ref[b], h, ps, :] = st


def _chunk_out_kernel(*, go_ref, rb_ref, fill_ref, xr_ref, dtr_ref, cb_ref, st_ref, z_ref=None,
                      alog_ref, d_ref, y_ref, plan: ChunkPlan):
  """Output, grid (H / out_heads x P / local_block_p, chunks, B), every chunk at once:
  (C Bᵀ ∘ decay ∘ dt) x + D x + exp(acum) C stᵀ (st: the chunk's starting state), gated,
  into y [B, y_rows, H*P] (rows of the padded body; the verify tail's rows are left). A
  sequence that does not run gets its `fill` [B] value (NaN: rejected, zero: padding, as
  `reference.finish_y` gives); chunks wholly past the sequence's body (`rb` [B] rows) get
  zeros. C Bᵀ is per group and chunk (`cb` [B, chunks, G, L, L] f32); a program loops over
  `out_heads` heads of one group."""
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

  @pl.when((go_ref[b] > 0) & live)
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

  @pl.when((go_ref[b] == 0) | jnp.logical_not(live))
  def _fill():
    value = jnp.where(go_ref[b] > 0, 0.0, fill_ref[b])
    tile = jnp.broadcast_to(value, (L, BP)).astype(y_ref.dtype)
    for j in range(NH):
      y_ref[b, rows, pl.ds((h0 + j) * P + pid_p * BP, BP)] = tile


def group_cb(cfg, xr, chunk: int, precision: str, interpret: bool):
  """C·Bᵀ of every chunk and group: [B, chunks, G, L, L] float32 from the post-conv rows
  `xr` [B, Rp, C], one batched matmul with products at `precision` (`backend.einsum`)."""
  Bsz, Rp, _ = xr.shape
  G, N, HP = cfg.ngroups, cfg.dstate, cfg.d_inner
  nc = Rp // chunk
  bm = xr[..., HP:HP + G * N].reshape(Bsz, nc, chunk, G, N)
  cm = xr[..., HP + G * N:HP + 2 * G * N].reshape(Bsz, nc, chunk, G, N)
  return backend.einsum("bctgn,bcsgn->bcgts", cm, bm, precision=precision,
                        interpret=interpret)


def chunk_scan(plan: ChunkPlan, cache_indices, slot, go, rb, fill, xr, dtr, z, A_log, D, ssm):
  """The chunked scan: the three kernels and `group_cb` between them.

  Args:
    plan: the launch.
    cache_indices, slot: [B] int32 pool entry and starting slot (snapshot) of each sequence.
    go: [B] int32: 1 runs the sequence; one with 0 gets y rows of its `fill` value and keeps
      its state.
    rb: [B] int32 body rows of each sequence (<= plan.Rb; fewer in a ragged prefill): its
      rows from rb on are padding (zero in xr and dtr); the chunks wholly past them are
      skipped and their y rows are 0.
    fill: [B] float32 y value of a sequence that does not run (NaN: rejected, 0: padding).
    xr: [B, Rp, C] post-conv body rows in the activation dtype, zero from each sequence's rb
      on (whole chunks).
    dtr: [B, Rp, H] float32 processed dt (zero from rb on).
    z: optional [B, >= Rp, H*P] gate.
    A_log, D: [H] float32.
    ssm: the state pool's ssm leaf (snapshot [E, S, H, P, N], compact [E, H, P, N]; float32
      or 16-bit storage, widened on load); the final state of each sequence goes over its
      starting slot or base, in place (rounded to the storage dtype).

  Returns:
    (ssm, y [B, y_rows, H*P] in the activation dtype). y's rows Rb.. are left for the verify
    tail.
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
      inputs=dict(go_ref=go, rb_ref=rb, xr_ref=xr, dtr_ref=dtr, alog_ref=A_log),
      outputs=dict(s_ref=sds((plan.B, nc, H, P, N), f32), dec_ref=sds((plan.B, nc, H), f32)),
      grid=(H // plan.state_heads * tiles_p, nc, plan.B),
      num_warps=t.state_warps, num_stages=t.state_stages,
      name=f"m2v_chunk_states_{cfg.replay_mode}")
  passed = launch(
      _chunk_pass_kernel,
      inputs=dict(idx_ref=cache_indices, slot_ref=slot, go_ref=go, rb_ref=rb,
                  dec_ref=own["dec_ref"], s_ref=own["s_ref"], ssm_ref=ssm),
      outputs=dict(ssm_out_ref=sds(ssm.shape, ssm.dtype),
                   st_ref=sds((plan.B, nc, H, P, N), f32)),
      aliases=dict(ssm_ref="ssm_out_ref"),
      grid=(P // plan.block_p, H, plan.B), num_warps=t.num_warps, num_stages=t.num_stages,
      name=f"m2v_chunk_pass_{cfg.replay_mode}")
  cb = group_cb(cfg, xr, plan.chunk, plan.precision, plan.interpret)
  out = launch(
      _chunk_out_kernel,
      inputs=dict(go_ref=go, rb_ref=rb, fill_ref=fill, xr_ref=xr, dtr_ref=dtr, cb_ref=cb,
                  st_ref=passed["st_ref"], z_ref=z if plan.has_z else None, alog_ref=A_log,
                  d_ref=D),
      outputs=dict(y_ref=sds((plan.B, plan.y_rows, cfg.d_inner), plan.y_dtype)),
      grid=(H // plan.out_heads * tiles_p, nc, plan.B),
      num_warps=t.out_warps, num_stages=t.out_stages,
      name=f"m2v_chunk_out_{cfg.replay_mode}")
  return passed["ssm_out_ref"], out["y_ref"]

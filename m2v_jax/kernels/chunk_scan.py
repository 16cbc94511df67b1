"""The chunked (SSD) scan of a prefill's body (docs/design.md, "The chunked prefill")."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax import config as config_lib
from m2v_jax import status
from m2v_jax.kernels import backend
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import tiles as tiles_lib

f32 = jnp.float32
LOG2E = float(np.log2(np.e))

# Bodies of up to this many rows get chunks of at most this many (`ChunkPlan.chunk`).
SHORT_BODY_CHUNK = 64

# Chunk-parallel programs below which a program takes fewer heads (about four per H200 SM).
MIN_LOCAL_PROGRAMS = 512


def supported(cfg: config_lib.Mamba2Config) -> bool:
  """Whether the compiled chunked scan takes `cfg`: its dots need P tiles and dstate >= 16."""
  return tiles_lib.pow2_divisor(cfg.headdim, 64) >= 16 and cfg.dstate >= 16


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """Static description of a chunked scan over T flat rows holding S sequences (the
  per-sequence arrays of the kernels have S + 1 entries, the last for the rows past them);
  E pool entries; gate, activation dtype, `ChunkTiles`, interpret mode; `max_body`, the
  longest body a sequence can have, sets the chunk of short calls.

  Raises ValueError, compiled, for a chunk, local_block_p, out_rows, out_cols (or block_p
  with `fused_pass`) below 16, and for a chunk below K-1.
  """

  cfg: config_lib.Mamba2Config
  T: int
  S: int
  E: int
  has_z: bool
  y_dtype: jnp.dtype
  tiles: tiles_lib.ChunkTiles
  interpret: bool = False
  max_body: int | None = None

  def __post_init__(self):
    if self.chunk < self.cfg.d_conv - 1:
      raise ValueError(f"chunked prefill: chunk {self.chunk} below the conv state's "
                       f"{self.cfg.d_conv - 1} rows")
    dims = dict(chunk=self.chunk, local_block_p=self.local_block_p, out_rows=self.out_rows,
                out_cols=self.out_cols)
    if self.tiles.fused_pass:
      dims["block_p"] = self.block_p
    if not self.interpret and min(dims.values()) < 16:
      raise ValueError(f"chunked prefill: compiled dots need {', '.join(dims)} >= 16, got "
                       f"{', '.join(map(str, dims.values()))}")

  @property
  def chunk(self) -> int:
    """Rows per chunk: the tiles', at most 64 for bodies of up to 64 rows."""
    body = self.T if self.max_body is None else self.max_body
    return min(self.tiles.chunk, max(SHORT_BODY_CHUNK, tiles_lib.next_pow2(body)))

  @property
  def n_slots(self) -> int:
    """Slots enough for any layout: each segment's `segment_slots`, the last segment's
    holding its bodies and the blocks to fill (sum(ceil(a_i / L)) <= T // L + (number of
    terms))."""
    return ((self.segment_count - 1) * self.segment_slots + self.T // self.chunk
            + 2 * (self.S + 1))

  @property
  def body_slots(self) -> int:
    """Slots that may hold a body chunk: each segment's first `segment_slots` (in one
    segment, T // L + S: enough for any layout)."""
    return self.segment_count * self.segment_slots

  @property
  def conv_T(self) -> int:
    """Rows of the post-conv and dt scratch of all body slots, L per slot (slot i at rows
    i*L ..); a segment's holds `Segment.body` * L (all of them in a call of one segment)."""
    return self.body_slots * self.chunk

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
    grid has fewer than MIN_LOCAL_PROGRAMS programs over the chunks that T can hold.
    """
    nh = tiles_lib.pow2_divisor(self.cfg.heads_per_group, wanted)
    per_head = (self.cfg.headdim // self.local_block_p) * max(self.T // self.chunk, 1)
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
  def st_dtype(self):
    """The chunks' starting states' dtype: bf16 where the output kernel's product rounds to it."""
    return jnp.dtype(jnp.bfloat16 if self.precision == config_lib.BF16 else f32)

  @property
  def out_rows(self) -> int:
    """Chunk rows per output and C·Bᵀ program, dividing the chunk."""
    return min(self.tiles.out_rows, self.chunk)

  @property
  def out_cols(self) -> int:
    """Columns per block of the output kernel's causal sum, dividing out_rows."""
    return min(self.tiles.out_cols or self.out_rows, self.out_rows)

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
  def silu(self):
    """The body conv's silu: `backend.silu`, approximate at bf16 products with 16-bit y."""
    return backend.silu(self.interpret, self.precision == config_lib.BF16
                        and jnp.dtype(self.y_dtype).itemsize == 2)

  @property
  def slot_bytes(self) -> int:
    """Scratch bytes of one body slot in a segment: post-conv rows and processed dt, C·Bᵀ,
    starting states and, unfused, the chunk states and decays; with `out_acum` its cumulative
    dt·A; with `fused_y` the post-conv rows and dt only."""
    cfg, L = self.cfg, self.chunk
    H = cfg.nheads
    state = H * cfg.headdim * cfg.dstate
    rows = L * (cfg.conv_dim * jnp.dtype(self.y_dtype).itemsize + 4 * H)
    if self.tiles.fused_y:
      return rows
    own = (0 if self.tiles.fused_pass else 4 * (state + H)) + (
        4 * L * H if self.tiles.out_acum else 0)
    return rows + 4 * cfg.ngroups * L * L + own + self.st_dtype.itemsize * state

  def _slots_per_segment(self, n: int) -> int:
    """Body slots of each of n segments: enough for any layout, where each body's part in a
    segment has at most ceil(its chunks / n) chunks (`slot_table`): sum_s ceil(nb_s / n) <=
    (T // L) // n + S."""
    return self.T // self.chunk // n + self.S

  def scratch_at(self, n: int) -> int:
    """Bytes of scratch at once with n segments: one segment's body slots and, with more
    than one, each sequence's float32 state carried between segments."""
    cfg, per = self.cfg, self._slots_per_segment(n)
    carry = 4 * self.S * cfg.nheads * cfg.headdim * cfg.dstate if n > 1 else 0
    return per * self.slot_bytes + carry

  @property
  def scratch_budget(self) -> int:
    """Bytes of scratch the call may take at once: `tiles.scratch_mb` per sequence (0: no
    limit)."""
    return round(self.tiles.scratch_mb * 1e6) * self.S

  @functools.cached_property
  def segment_count(self) -> int:
    """Segments of the call: one where all body slots' scratch fits `scratch_budget`, else the
    fewest that fit it (`scratch_at`).

    Raises ValueError where no count does (each segment holds a slot per sequence at least).
    """
    budget, counts = self.scratch_budget, range(1, self.T // self.chunk + 2)
    if not budget:
      return 1
    for n in counts:
      if self.scratch_at(n) <= budget:
        return n
    least = math.ceil(min(map(self.scratch_at, counts)) / self.S / 1e4) / 100   # MB, up
    raise ValueError(f"ChunkTiles.scratch_mb={self.tiles.scratch_mb}: a chunk's scratch per "
                     f"sequence and the states carried between segments need {least:.2f} "
                     f"MB a sequence here; ask for at least that, or 0 for no limit")

  @property
  def segment_slots(self) -> int:
    """Body slots of each segment."""
    return self._slots_per_segment(self.segment_count)

  @property
  def segments(self) -> tuple["Segment", ...]:
    """The slot table in `segment_count` runs of `segment_slots` (the last also takes the
    blocks to fill), scanned one after the other, each with scratch for its body slots.
    Each segment holds the next part of every body (`slot_table`), so its kernels run all
    the call's sequences at once."""
    n, per = self.segment_count, self.segment_slots
    return tuple(Segment(start=j * per, stop=(j + 1) * per if j < n - 1 else self.n_slots,
                         body=per, index=j, count=n) for j in range(n))

  @property
  def products(self) -> backend.Products | None:
    """The products at "highest" with 16-bit activations: `backend.Products` passes, which
    keep the activation-dtype operands (post-conv x, B, C) whole and split only the float32
    ones (as accurate as three TF32 passes of every product: C·Bᵀ in one pass, the others in
    three bf16 passes, of twice TF32's rate, or two TF32 passes with float16); else None
    (`backend.dot` at `precision`)."""
    if self.precision != config_lib.HIGHEST or jnp.dtype(self.y_dtype).itemsize != 2:
      return None
    return backend.Products(exact_rows=True, tensor_cores=not self.interpret,
                            bf16_rows=jnp.dtype(self.y_dtype) == jnp.bfloat16)

  def dot(self, a, b, split: str, *, trans_a=False, trans_b=False):
    """float32 op(a) op(b) of 2-D tiles at the plan's precision; `split` names the operands
    that hold float32 values ("a", "b" or ""; `products`)."""
    mm = self.products
    if mm is None:
      return backend.dot(a, b, precision=self.precision, trans_a=trans_a, trans_b=trans_b,
                         interpret=self.interpret)
    return mm.product(a.astype(f32), b.astype(f32), split, trans_a=trans_a, trans_b=trans_b)

  @property
  def precision(self) -> str:
    """"highest", "tf32" or "bf16" (`Mamba2Config.prefill_precision_for`)."""
    return self.cfg.prefill_precision_for(self.y_dtype)


def scratch_bytes(plan: ChunkPlan) -> int:
  """Bytes of the chunked body's intermediate buffers at once (`ChunkPlan.scratch_at` its
  segments)."""
  return plan.scratch_at(plan.segment_count)


class Segment(NamedTuple):
  """Slots start .. stop - 1 of a call's table, scanned as one: its first `body` slots have
  scratch rows (every body slot among them does); segment `index` of `count`."""

  start: int
  stop: int
  body: int
  index: int
  count: int


class Slots(NamedTuple):
  """A call's slots (int32: numpy for a layout the host knows, else device arrays;
  `slot_table`): per slot [n_slots] its sequence, first flat row, rows (0: unused), and 1
  for a body chunk or 0 for rows to fill; per segment and sequence [segments, S + 1] the
  first of its body slots in the segment (counted from the segment's first slot), their
  count, and whether its body opens in the segment (`opens`), began in an earlier one
  (`carry_in`: it starts from the carried state) or goes on in a later one (`carry_out`).

  A segment's view (`segment_view`) holds its slots and its row of the rest; the last three
  are None in a call of one segment.
  """

  seq: jax.Array
  row0: jax.Array
  rows: jax.Array
  body: jax.Array
  first: jax.Array
  count: jax.Array
  opens: jax.Array | None = None
  carry_in: jax.Array | None = None
  carry_out: jax.Array | None = None


def kernel_tag(plan: ChunkPlan, seg: Segment) -> str:
  """The end of a segment's kernel names: the replay mode, then `_seg` where a call has
  several segments (one name for all, so that XLA compiles a kernel that several segments
  launch alike once)."""
  return plan.cfg.replay_mode + ("_seg" if seg.count > 1 else "")


def segment_view(slots: Slots, seg: Segment) -> Slots:
  """`slots` as segment `seg` sees them (`Slots`)."""
  j = seg.index
  if seg.count == 1:
    return Slots(slots.seq, slots.row0, slots.rows, slots.body, slots.first[j], slots.count[j])
  cut = lambda a: a[seg.start:seg.stop]
  return Slots(cut(slots.seq), cut(slots.row0), cut(slots.rows), cut(slots.body),
               *(a[j] for a in slots[4:]))


# Rows of a segment's per-sequence table (`seq_table`).
RUNS, ENTRY, START, FIRST, COUNT, CARRY_IN, CARRY_OUT = range(7)


def with_trailing(a, value):
  """[S] -> [S+1]: `a` and the entry of the rows past the sequences (numpy for numpy `a`)."""
  xp = np if isinstance(a, np.ndarray) else jnp
  return xp.concatenate([a, xp.reshape(xp.asarray(value), (1,)).astype(a.dtype)])


def seq_table(runs, entry, start, slots: Slots):
  """[7, S+1] int32, one array (one XLA op) for every kernel of a segment: per sequence 1 if
  it runs, its pool entry (-1: padding) and its starting slot (snapshot), from runs, entry
  and start [S]; the entry past the sequences, S, does not run and has entry -1, so its rows
  get the fill 0 (`_fill_value`); then from `slots` (the segment's view, [S+1] each) the
  first body slot, their count, carry in and carry out (0 in a call of one segment). numpy
  where every input is."""
  xp = np if all(isinstance(a, np.ndarray) or a is None
                 for a in (runs, entry, start) + tuple(slots[4:])) else jnp
  per_seq = [with_trailing(xp.asarray(a, np.int32), v)
             for a, v in ((runs, 0), (entry, -1), (start, 0))]
  zero = xp.zeros_like(per_seq[0])
  return xp.stack(per_seq + [xp.asarray(a, np.int32) if a is not None else zero
                             for a in (slots.first, slots.count, slots.carry_in,
                                       slots.carry_out)])


class CallSeqs(NamedTuple):
  """A snapshot prefill's per-sequence table for `chunk_conv.body_conv` to complete, where the
  host knows every num_rows is valid: the body conv forms the rows RUNS, ENTRY and START from
  the call's cache_indices and state_row itself (`call_rows`) and returns the whole table for
  the segment's other kernels, so no XLA op builds it."""

  table: np.ndarray           # [7, S+1] int32: `seq_table`'s, its rows RUNS, ENTRY, START 0
  cache_indices: jax.Array    # [S] int32
  state_row: jax.Array        # [S] int32


def call_rows(plan: ChunkPlan, entry, row, s):
  """(runs, entry, start) of sequence s (scalars or arrays; s = S: the entry past the
  sequences, not run, entry -1) from its cache_indices entry and state_row, as `seq_table`
  holds them in a snapshot call whose num_rows are valid: it runs where the entry is in the
  pool and state_row in [0, capacity) (`status.sequence_status`)."""
  inside = s < plan.S
  # Snapshot, nothing pending; num_rows valid: one row of one stands for them.
  valid, _, _ = status.sequence_status(False, plan.cfg.capacity, plan.E, 1, entry, row, 1, 0)
  runs = inside & valid
  return runs.astype(jnp.int32), jnp.where(inside, entry, -1), jnp.where(runs, row, 0)


def _fill_value(seqs_ref, s, shape):
  """A float32 tile of y for sequence s's rows that no kernel computes: 0 where it runs or is
  padding, else NaN (rejected)."""
  zero = (seqs_ref[RUNS, s] > 0) | (seqs_ref[ENTRY, s] == -1)
  return jnp.where(zero, jnp.zeros(shape, f32), jnp.full(shape, jnp.nan, f32))


def slot_table(plan: ChunkPlan, base, n, span, rb) -> Slots:
  """Slots for sequences at flat rows `base` [S+1] with `n` rows, `span` rows reserved (n and
  past: filled) and `rb` body rows. Each body's nb chunks are cut into one part per segment
  (floor(nb / segments) or one more; one chunk in each of the first nb segments where nb is
  fewer), its part j in segment j; a segment lists the sequences' parts in order, each part's
  chunks in order, and the last segment then each block to fill. In one segment: each body
  in chunks, then each filled block.

  With numpy inputs (a layout the host knows) the table is built on the host, as numpy
  arrays, and enters the kernels as constants; else it is built on the device."""
  xp = np if all(isinstance(a, np.ndarray) for a in (base, n, span, rb)) else jnp
  base, n, span, rb = (xp.asarray(a) for a in (base, n, span, rb))
  L, ns, S1 = plan.chunk, plan.n_slots, plan.S + 1
  nseg, per = plan.segment_count, plan.segment_slots
  i32 = np.int32
  gap = span - n
  nb, ng = (rb + L - 1) // L, (gap + L - 1) // L
  j1 = xp.arange(nseg + 1, dtype=i32)[:, None]
  even = j1 * (nb // nseg) + j1 * (nb % nseg) // nseg                 # j nb // nseg, in int32
  lo = xp.where(nb >= nseg, even, xp.minimum(nb, j1))               # [nseg+1, S1] part starts
  part = lo[1:] - lo[:-1]                                           # [nseg, S1]
  fills = xp.where(j1[1:] == nseg, ng[None, :], 0)                  # the last segment's
  sizes = xp.concatenate([part, fills], axis=1)                     # [nseg, 2 S1]
  ends = xp.cumsum(sizes, axis=1)
  starts = ends - sizes
  i = xp.arange(ns, dtype=i32)
  j = xp.minimum(i // per, nseg - 1)                                # the slot's segment
  at = i - j * per
  k = xp.sum(ends[j] <= at[:, None], axis=1).astype(i32)            # 2(S+1): unused
  used = k < 2 * S1
  kk = xp.minimum(k, 2 * S1 - 1)
  body = kk < S1
  s = xp.where(body, kk, kk - S1)
  c = at - starts[j, kk] + xp.where(body, lo[j, s], 0)             # chunk (block) of it
  row0 = xp.where(used, base[s] + xp.where(body, 0, n[s]) + c * L, 0)
  rows = xp.where(used, xp.minimum(L, xp.where(body, rb[s], gap[s]) - c * L), 0)
  has = part > 0
  flag = lambda a: (a & has).astype(i32)
  return Slots(s.astype(i32), row0.astype(i32), rows.astype(i32), (body & used).astype(i32),
               starts[:, :S1].astype(i32), part.astype(i32), opens=flag(lo[:-1] == 0),
               carry_in=flag(lo[:-1] > 0), carry_out=flag(lo[1:] < nb[None, :]))


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


def _slot(seq_ref, row_ref, len_ref, L):
  """(slot, sequence, its scratch rows, its flat rows (pl.ds), live [L] bool) of program id 1."""
  i = pl.program_id(1)
  live = lax.broadcasted_iota(jnp.int32, (L,), 0) < len_ref[i]
  return i, seq_ref[i], pl.ds(i * L, L), pl.ds(row_ref[i], L), live


def _chunk_cb_kernel(*, row_ref, len_ref, body_ref, seq_ref, seqs_ref, xr_ref, cb_ref,
                     dtr_ref=None, alog_ref=None, acr_ref=None,
                     plan: ChunkPlan):
  """C·Bᵀ of each slot's rows, out_rows rows of it per program, grid (G, body slots,
  chunk / out_rows), and with acr_ref the cumulative dt·A of the group's heads.

    xr_ref [rows, C] post-conv rows, L per body slot of the segment; cb_ref [its body slots,
      G, L, L] f32
    dtr_ref as `_chunk_states_kernel`; alog_ref [H] f32
    acr_ref [H, its body slots * L] f32: each slot's cumulative dt·A from its first row
      (with `ChunkTiles.out_acum`), written by the programs of the slot's first row block.
  """
  cfg = plan.cfg
  N, G, HP, L, BM = cfg.dstate, cfg.ngroups, cfg.d_inner, plan.chunk, plan.out_rows
  g, r0 = pl.program_id(0), pl.program_id(2) * BM
  i, s, rows, _, _ = _slot(seq_ref, row_ref, len_ref, L)
  run = (body_ref[i] > 0) & (seqs_ref[RUNS, s] > 0)

  @pl.when(run)
  def _run():
    bm = xr_ref[rows, pl.ds(HP + g * N, N)]                      # [L, N] activation dtype
    cm = xr_ref[pl.ds(i * L + r0, BM), pl.ds(HP + G * N + g * N, N)]   # [BM, N]
    cb_ref[i, g, pl.ds(r0, BM), :] = plan.dot(cm, bm, "", trans_b=True)

  if acr_ref is None:
    return
  hg = cfg.heads_per_group
  nh = tiles_lib.pow2_divisor(hg, 32)                # heads a scan (Triton: a power of two)

  @pl.when(run & (r0 == 0))
  def _sums():
    for j in range(hg // nh):
      hs = pl.ds(g * hg + j * nh, nh)
      a = -jnp.exp(alog_ref[hs])                                 # [nh]
      acum = jnp.cumsum(dtr_ref[pl.ds(i * L, L), hs] * a[None, :], axis=0)  # [L, nh]
      acr_ref[hs, pl.ds(i * L, L)] = acum.T


def _store_block(plan: ChunkPlan, y_ref, out_rows, cols, y, lv, full) -> None:
  """Stores y [BM, BP] at y_ref[out_rows, cols]: unmasked where `full` (every row of the
  block is the slot's), else the rows where lv [BM, 1]; always masked where y has fewer
  than BM rows."""
  if plan.T < y.shape[0]:                          # no whole block fits in y
    backend.store(y_ref.at[out_rows, cols], y, lv)
    return
  pl.when(full)(lambda: y_ref.__setitem__((out_rows, cols), y))
  pl.when(jnp.logical_not(full))(lambda: backend.store(y_ref.at[out_rows, cols], y, lv))


def _slot_rows(plan: ChunkPlan, xr_ref, dtr_ref, i, h, pid_p, BP):
  """Slot i's x [L, BP] (activation dtype) and dt [L] of head h."""
  P, L = plan.cfg.headdim, plan.chunk
  return (xr_ref[pl.ds(i * L, L), pl.ds(h * P + pid_p * BP, BP)],
          dtr_ref[pl.ds(i * L, L), h])


def _own_from(plan: ChunkPlan, x, dtv, a_h, bm, sums=None):
  """(x * exp(acum_L - acum) dt)ᵀ B [BP, N] of one slot's rows from a zero start, and
  exp(acum_L); `sums` (acum [L], acum_L) where loaded, else summed here."""
  x = x.astype(f32)
  acum, acum_l = sums or _log_decay(dtv, a_h, plan.chunk)
  w_s = jnp.exp(acum_l - acum) * dtv
  if plan.products is None:
    own = plan.dot(x * w_s[:, None], bm, "a", trans_a=True)
  else:                                              # x whole, the weights on B
    own = plan.dot(x, w_s[:, None] * bm.astype(f32), "b", trans_a=True)
  return own, jnp.exp(acum_l)


def _chunk_states_kernel(*, seq_ref, row_ref, len_ref, body_ref, seqs_ref, xr_ref, dtr_ref,
                         alog_ref, s_ref, dec_ref, plan: ChunkPlan):
  """Chunk states from a zero start, grid (H / state_heads * P / local_block_p, body slots).

    seq_ref, row_ref, len_ref, body_ref [slots] int32; seqs_ref [7, S+1] int32 (`seq_table`)
    xr_ref [rows, C] post-conv rows: L rows per body slot of the segment, zero past its rows
    dtr_ref [rows, H] f32 processed dt of the same rows, zero past each slot's rows
    s_ref   [body slots, H, P, N] f32   (x * exp(acum_L - acum) dt)ᵀ B over the slot's rows
    dec_ref [body slots, H] f32         exp(acum_L)
  """
  cfg = plan.cfg
  N, HP, L, BP, NH = cfg.dstate, cfg.d_inner, plan.chunk, plan.local_block_p, plan.state_heads
  i, s, rows, _, _ = _slot(seq_ref, row_ref, len_ref, L)
  h0, pid_p = _head_grid(plan, NH)
  g = h0 // cfg.heads_per_group

  @pl.when((body_ref[i] > 0) & (seqs_ref[RUNS, s] > 0))
  def _run():
    bm = xr_ref[rows, pl.ds(HP + g * N, N)]                      # [L, N] activation dtype

    def head(j, carry):
      h = h0 + j
      x, dtv = _slot_rows(plan, xr_ref, dtr_ref, i, h, pid_p, BP)
      own, dec = _own_from(plan, x, dtv, -jnp.exp(alog_ref[h]), bm)
      s_ref[i, h, pl.ds(pid_p * BP, BP), :] = own
      dec_ref[i, h] = dec
      return carry

    _for_heads(NH, head)


def pool_index(plan: ChunkPlan, entry, start):
  """Index of a state in a pool leaf (ssm or conv): its entry (-1 read as 0; compact, the
  base), or its entry and starting slot (snapshot)."""
  e = jnp.maximum(entry, 0)
  return (e,) if plan.cfg.compact else (e, start)


def pool_entry(plan: ChunkPlan, seqs_ref, b):
  """Index of sequence b's state in a pool leaf, from `seq_table` (`pool_index`)."""
  return pool_index(plan, seqs_ref[ENTRY, b],
                    None if plan.cfg.compact else seqs_ref[START, b])


def _pool_at(plan: ChunkPlan, seqs_ref, b, h, ps):
  """Index of sequence b's head-h, P-tile `ps` state in the pool's ssm leaf (`pool_entry`)."""
  return pool_entry(plan, seqs_ref, b) + (h, ps, slice(None))


def _start_state(plan: ChunkPlan, ssm_ref, at, seqs_ref, carry_ref, b, h, ps):
  """Sequence b's float32 state before its first body slot of the segment: the pool's at
  `at`, or its carried one where its body began in an earlier segment."""
  st = ssm_ref[at].astype(f32)
  if carry_ref is None:
    return st
  cin = seqs_ref[CARRY_IN, b] > 0
  return jnp.where(cin, backend.load(carry_ref.at[_carried(plan, b), h, ps, :], cin), st)


def _carried(plan: ChunkPlan, b):
  """Sequence b's row of the carried states (the entry past the sequences has no body)."""
  return jnp.minimum(b, plan.S - 1)


def _end_state(plan: ChunkPlan, st, ssm_out_ref, at, seqs_ref, carry_out_ref, b, h,
               ps) -> None:
  """Stores sequence b's state after its last body slot of the segment: into the pool at
  `at`, or into its carried state where its body goes on in a later segment."""
  if carry_out_ref is None:
    ssm_out_ref[at] = st.astype(ssm_out_ref.dtype)
    return
  cout = seqs_ref[CARRY_OUT, b] > 0
  backend.store(carry_out_ref.at[_carried(plan, b), h, ps, :], st, cout)
  backend.store(ssm_out_ref.at[at], st.astype(ssm_out_ref.dtype), jnp.logical_not(cout))


def _chunk_states_pass_kernel(*, seqs_ref, xr_ref, dtr_ref, alog_ref, ssm_ref, ssm_out_ref,
                              st_ref, carry_ref=None, carry_out_ref=None, acr_ref=None,
                              plan: ChunkPlan):
  """Chunk states and state passing in one, grid (P / block_p, H, S+1): a sequence's body
  slots in order, each slot's own state by `_own_from` and st = dec * st + own.

    Refs as `_chunk_states_kernel` and `_chunk_pass_kernel`, plus
    acr_ref [H, the segment's body slots * L] f32: cumulative dt·A (`_chunk_cb_kernel`),
      loaded for each slot's decay weights where present, else summed here.
  """
  cfg = plan.cfg
  N, HP, L, BP = cfg.dstate, cfg.d_inner, plan.chunk, plan.block_p
  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  ps = pl.ds(pid_p * BP, BP)
  first, count = seqs_ref[FIRST, b], seqs_ref[COUNT, b]
  bcols = pl.ds(HP + h // cfg.heads_per_group * N, N)
  at = _pool_at(plan, seqs_ref, b, h, ps)

  @pl.when((seqs_ref[RUNS, b] > 0) & (count > 0))
  def _run():
    st = _start_state(plan, ssm_ref, at, seqs_ref, carry_ref, b, h, ps)
    a_h, last = -jnp.exp(alog_ref[h]), first + count - 1

    def rows_of(i):
      """Slot i's x, dt and, where loaded, its acum and acum_L."""
      got = _slot_rows(plan, xr_ref, dtr_ref, i, h, pid_p, BP)
      if acr_ref is None:
        return got
      return got + (acr_ref[h, pl.ds(i * L, L)], acr_ref[h, i * L + L - 1])

    def chunk(c, carry):               # the next slot's rows loaded before this one's work
      st, x, dtv, *sums = carry
      i = first + c
      ahead = rows_of(jnp.minimum(i + 1, last))
      sums = tuple(sums) if acr_ref is not None else None
      own, dec = _own_from(plan, x, dtv, a_h, xr_ref[pl.ds(i * L, L), bcols], sums)
      st_ref[i, h, ps, :] = st.astype(st_ref.dtype)
      return (dec * st + own,) + ahead

    st = lax.fori_loop(0, count, chunk, (st,) + rows_of(first))[0]
    _end_state(plan, st, ssm_out_ref, at, seqs_ref, carry_out_ref, b, h, ps)


def _chunk_fused_kernel(*, seqs_ref, row_ref, len_ref, xr_ref, dtr_ref, alog_ref, d_ref,
                        z_ref=None, ssm_ref, y_in_ref=None, ssm_out_ref, y_ref, carry_ref=None,
                        carry_out_ref=None, plan: ChunkPlan):
  """The whole scan of a sequence's body slots, grid (P / block_p, H, S+1): per slot in
  order, y from the carried state in blocks of out_rows rows (the causal sum in blocks of
  out_cols columns), then st = dec * st + own (`ChunkTiles.fused_y`).

    Refs as `_chunk_states_pass_kernel` and `_chunk_out_kernel` (no C·Bᵀ, starting states
    or loaded sums: C·Bᵀ and the cumulative dt·A are computed here); y_ref [T, H*P] gets the
    rows of the sequence's body slots (masked where a slot is partial), `_fill_value` where
    the sequence does not run.
  """
  del y_in_ref
  cfg = plan.cfg
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, L, BP, BM, BK = cfg.d_inner, plan.chunk, plan.block_p, plan.out_rows, plan.out_cols
  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  ps = pl.ds(pid_p * BP, BP)
  first, count = seqs_ref[FIRST, b], seqs_ref[COUNT, b]
  g = h // cfg.heads_per_group
  bcols, ccols = pl.ds(HP + g * N, N), pl.ds(HP + G * N + g * N, N)
  xcols = pl.ds(h * P + pid_p * BP, BP)
  at = _pool_at(plan, seqs_ref, b, h, ps)
  t_idx = lax.broadcasted_iota(jnp.int32, (BM, 1), 0)
  runs = seqs_ref[RUNS, b] > 0

  def store_rows(row, n, r0, y):
    """y [BM, BP] into rows r0 .. of a slot at flat row `row` with n rows: whole where the
    slot has them all, else masked."""
    _store_block(plan, y_ref, pl.ds(row + r0, BM), xcols, y, r0 + t_idx < n, n >= r0 + BM)

  @pl.when(runs & (count > 0))
  def _run():
    st = _start_state(plan, ssm_ref, at, seqs_ref, carry_ref, b, h, ps)
    a_h, d_h, last = -jnp.exp(alog_ref[h]), d_ref[h], first + count - 1
    col = lax.broadcasted_iota(jnp.int32, (L,), 0)

    def rows_from(i, k0, n, whole):
      """x [n, BP], dt [n], acum [n] (from the slot's first row) of slot i's n rows from k0:
      the whole slot's values where n = L, else loaded (acum: the rows before, summed, plus
      the rows' own running sum)."""
      if n == L:
        return whole
      _, dtv, acum = whole
      rows = pl.ds(i * L + k0, n)
      dtk = dtr_ref[pl.ds(i * L + k0, n), h]
      before = jnp.sum(jnp.where(col < k0, dtv * a_h, 0.0)) if k0 else 0.0
      return xr_ref[rows, xcols], dtk, before + jnp.cumsum(dtk * a_h)

    exp2, log2 = backend.exp2(plan.interpret), backend.log2(plan.interpret)
    fast = plan.precision == config_lib.BF16

    def weights(a_r, acum_r, acum_k, dt_k):
      """[BM, BK] dt_s exp(acum_t - acum_s) (t's rows, s's columns, not yet masked): at
      "bf16" products one exp2, 2^(a_t - b_s) with a = acum log2(e) and b = a - log2(dt)
      (dt = 0: b = inf, a zero weight), else exp of min(acum_t - acum_s, 0)."""
      if fast:
        return exp2(a_r[:, None] - (acum_k * LOG2E - log2(dt_k))[None, :])
      return jnp.exp(jnp.minimum(acum_r[:, None] - acum_k[None, :], 0.0)) * dt_k[None, :]

    def y_block(i, m, st, whole, bm, cm, row, n):
      """y of rows m*BM .. of slot i (at flat row `row`, n rows): D x + exp(acum) C stᵀ +
      (C Bᵀ ∘ decay ∘ dt) x, the causal sum over blocks of BK columns up to the block's last
      row; bm [L, N] and cm [L, N]: the slot's B and C where one block spans the slot."""
      r0 = m * BM
      x_r, _, acum_r = rows_from(i, r0, BM, whole)
      if cm is None:
        cm = xr_ref[pl.ds(i * L + r0, BM), ccols]                        # [BM, N]
      acc = jnp.exp(acum_r)[:, None] * plan.dot(cm, st, "b", trans_b=True)  # [BM, BP]
      a_r = acum_r * LOG2E
      for k in range(-(-(r0 + BM) // BK)):
        k0 = k * BK
        x_k, dt_k, acum_k = rows_from(i, k0, BK, whole)
        bm_k = bm if BK == L else xr_ref[pl.ds(i * L + k0, BK), bcols]    # [BK, N]
        causal = r0 + t_idx >= k0 + lax.broadcasted_iota(jnp.int32, (BM, BK), 1)
        w = jnp.where(causal, weights(a_r, acum_r, acum_k, dt_k), 0.0)    # [BM, BK]
        acc = acc + plan.dot(plan.dot(cm, bm_k, "", trans_b=True) * w, x_k, "a")
      y = d_h * x_r.astype(f32) + acc
      if plan.has_z:
        lv = r0 + t_idx < n
        z = backend.load(z_ref.at[pl.ds(row + r0, BM), xcols], lv)
        y = rowmath.gate(y, z.astype(f32))
      store_rows(row, n, r0, y.astype(y_ref.dtype))

    def rows_of(i):
      """Slot i's x, dt, flat row and row count: loaded a step ahead."""
      return _slot_rows(plan, xr_ref, dtr_ref, i, h, pid_p, BP) + (row_ref[i], len_ref[i])

    def chunk(c, carry):               # the next slot's rows loaded before this one's work
      st, x, dtv, row, n = carry
      i = first + c
      ahead = rows_of(jnp.minimum(i + 1, last))
      bm = xr_ref[pl.ds(i * L, L), bcols]                                 # [L, N]
      cm = xr_ref[pl.ds(i * L, L), ccols] if BM == L else None            # [L, N]
      acum, acum_l = _log_decay(dtv, a_h, L)
      for m in range(L // BM):
        y_block(i, m, st, (x, dtv, acum), bm, cm, row, n)
      own, dec = _own_from(plan, x, dtv, a_h, bm, (acum, acum_l))
      return (dec * st + own,) + ahead

    st = lax.fori_loop(0, count, chunk, (st,) + rows_of(first))[0]
    _end_state(plan, st, ssm_out_ref, at, seqs_ref, carry_out_ref, b, h, ps)

  @pl.when(jnp.logical_not(runs) & (count > 0))
  def _fill():
    tile = _fill_value(seqs_ref, b, (BM, BP)).astype(y_ref.dtype)

    def fill(c, carry):
      i = first + c
      for m in range(L // BM):
        backend.store(y_ref.at[pl.ds(row_ref[i] + m * BM, BM), xcols], tile,
                      m * BM + t_idx < len_ref[i])
      return carry

    lax.fori_loop(0, count, fill, 0)


def _fill_kernel(*, seq_ref, row_ref, len_ref, body_ref, seqs_ref, y_in_ref=None, y_ref,
                 plan: ChunkPlan, block: int):
  """`_fill_value` into the rows of each slot that is not a body, grid (the segment's slots,
  H*P / block); y_ref [T, H*P] is aliased to y_in_ref where present."""
  del y_in_ref
  L = plan.chunk
  i, j = pl.program_id(0), pl.program_id(1)

  @pl.when((body_ref[i] == 0) & (len_ref[i] > 0))
  def _fill():
    tile = _fill_value(seqs_ref, seq_ref[i], (L, block)).astype(y_ref.dtype)
    lv = lax.broadcasted_iota(jnp.int32, (L, 1), 0) < len_ref[i]
    backend.store(y_ref.at[pl.ds(row_ref[i], L), pl.ds(j * block, block)], tile, lv)


def _chunk_pass_kernel(*, seqs_ref, dec_ref, s_ref, ssm_ref, ssm_out_ref, st_ref,
                       carry_ref=None, carry_out_ref=None, plan: ChunkPlan):
  """State passing, grid (P / block_p, H, S+1): st = dec * st + s over a sequence's slots.

    seqs_ref [7, S+1] int32: the segment's per-sequence table (`seq_table`)
    ssm_ref: the pool's ssm leaf, aliased to ssm_out_ref (the final state).
    st_ref [body slots, H, P, N] `st_dtype`: each slot's starting state (bf16 where the output
      kernel's products round it to bf16 anyway); not aliased to s_ref, so the
      next chunk's loads need not wait for this chunk's store.
    carry_ref [S, H, P, N] f32: each sequence's state carried in (where its body began in an
      earlier segment), aliased to carry_out_ref, the one carried out (absent where no
      segment comes before or after).
  """
  BP = plan.block_p
  pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  ps = pl.ds(pid_p * BP, BP)
  first, count = seqs_ref[FIRST, b], seqs_ref[COUNT, b]
  at = _pool_at(plan, seqs_ref, b, h, ps)

  @pl.when((seqs_ref[RUNS, b] > 0) & (count > 0))
  def _run():
    st = _start_state(plan, ssm_ref, at, seqs_ref, carry_ref, b, h, ps)

    def chunk(c, st):
      own = s_ref[first + c, h, ps, :]
      st_ref[first + c, h, ps, :] = st.astype(st_ref.dtype)
      return dec_ref[first + c, h] * st + own

    st = lax.fori_loop(0, count, chunk, st)
    _end_state(plan, st, ssm_out_ref, at, seqs_ref, carry_out_ref, b, h, ps)


def _chunk_out_kernel(*, seq_ref, row_ref, len_ref, body_ref, seqs_ref, xr_ref, dtr_ref,
                      cb_ref, st_ref, z_ref=None, alog_ref, d_ref, y_in_ref=None, y_ref,
                      acr_ref=None, plan: ChunkPlan):
  """y of a block of out_rows rows of every slot, gated, grid (H / out_heads * P /
  local_block_p, slots, chunk / out_rows); the causal sum runs over blocks of out_cols
  columns.

    cb_ref: C·Bᵀ of each slot; st_ref: starting states; seqs_ref as `_chunk_states_kernel`
    (the rows of a sequence not run and its rows past n get `_fill_value`); xr_ref, dtr_ref
    as `_chunk_states_kernel`;
    z_ref [T, H*P]; y_ref [T, H*P] (only the slots' rows are written, by masked stores: the
    verify tails' rows and other segments' are not), aliased to y_in_ref after the first
    segment.
    acr_ref [H, the segment's body slots * L] f32: cumulative dt·A (`_chunk_cb_kernel`),
      present with `ChunkTiles.out_acum`.
  """
  del y_in_ref
  cfg = plan.cfg
  P, N, G = cfg.headdim, cfg.dstate, cfg.ngroups
  HP, L, BP, NH, BM = cfg.d_inner, plan.chunk, plan.local_block_p, plan.out_heads, plan.out_rows
  BK = plan.out_cols
  i, s, _, _, _ = _slot(seq_ref, row_ref, len_ref, L)
  m = pl.program_id(2)
  r0 = m * BM
  trips = m + 1 if BK == BM else (r0 + BM) // BK             # column blocks up to the diagonal
  rows, out_rows = pl.ds(i * L + r0, BM), pl.ds(row_ref[i] + r0, BM)
  t_idx = lax.broadcasted_iota(jnp.int32, (BM, BK), 0)
  s_idx = lax.broadcasted_iota(jnp.int32, (BM, BK), 1)
  lv = r0 + lax.broadcasted_iota(jnp.int32, (BM, 1), 0) < len_ref[i]
  h0, pid_p = _head_grid(plan, NH)
  g = h0 // cfg.heads_per_group
  body = (body_ref[i] > 0) & (seqs_ref[RUNS, s] > 0)
  has_rows = r0 < len_ref[i]

  @pl.when(body & has_rows)
  def _run():
    cm = xr_ref[rows, pl.ds(HP + G * N + g * N, N)]              # [BM, N]
    col = lax.broadcasted_iota(jnp.int32, (L,), 0)

    def c_st(h):
      """C stᵀ [BM, BP] of head h's starting state."""
      return plan.dot(cm, st_ref[i, h, pl.ds(pid_p * BP, BP), :], "b", trans_b=True)

    def add_block(acc, k0, w, xcols):
      """acc + (C·Bᵀ ∘ w) x over the BK columns from k0, w [BM, BK]."""
      cb = cb_ref[i, g, pl.ds(r0, BM), pl.ds(k0, BK)]
      return acc + plan.dot(cb * w, xr_ref[pl.ds(i * L + k0, BK), xcols], "a")

    def loaded_sum(h, xcols):
      """exp(acum) C stᵀ plus the causal sum over blocks of BK columns, acum loaded."""
      at = lambda k0, n: (h, pl.ds(i * L + k0, n))
      acum = acr_ref[at(r0, BM)]                                 # [BM]
      cst = c_st(h)

      def column_block(k, acc):
        k0 = k * BK
        causal = r0 + t_idx >= k0 + s_idx
        decay = jnp.exp(jnp.minimum(acum[:, None] - acr_ref[at(k0, BK)][None, :], 0.0))
        w = jnp.where(causal, decay * dtr_ref[pl.ds(i * L + k0, BK), h][None, :], 0.0)
        return add_block(acc, k0, w, xcols)

      return lax.fori_loop(0, trips, column_block, jnp.exp(acum)[:, None] * cst)

    def summed(h, xcols):
      """y before the gate, each column block summing its own acum."""
      a_h = -jnp.exp(alog_ref[h])
      a_all = dtr_ref[pl.ds(i * L, L), h] * a_h            # [L]

      def rows_from(k0, n):
        """dt and acum (from the slot's first row) [n] of the n rows from row k0."""
        dtv = dtr_ref[pl.ds(i * L + k0, n), h]
        return dtv, jnp.sum(jnp.where(col < k0, a_all, 0.0)) + jnp.cumsum(dtv * a_h)

      _, acum = rows_from(r0, BM)

      def column_block(k, acc):
        k0 = k * BK
        dtk, acum_k = rows_from(k0, BK)
        causal = r0 + t_idx >= k0 + s_idx
        seg = jnp.where(causal, acum[:, None] - acum_k[None, :], 0.0)
        w = jnp.where(causal, jnp.exp(seg), 0.0) * dtk[None, :]
        return add_block(acc, k0, w, xcols)

      acc = lax.fori_loop(0, trips, column_block, jnp.zeros((BM, BP), f32))
      x = xr_ref[rows, xcols].astype(f32)
      y = acc + d_ref[h] * x
      cst = c_st(h)
      return y + jnp.exp(acum)[:, None] * cst

    def head(j, carry):
      h = h0 + j
      xcols = pl.ds(h * P + pid_p * BP, BP)
      if acr_ref is None:
        y = summed(h, xcols)
      else:
        y = d_ref[h] * xr_ref[rows, xcols].astype(f32) + loaded_sum(h, xcols)
      if plan.has_z:
        y = rowmath.gate(y, backend.load(z_ref.at[out_rows, xcols], lv).astype(f32))
      _store_block(plan, y_ref, out_rows, xcols, y.astype(y_ref.dtype), lv,
                   len_ref[i] >= r0 + BM)
      return carry

    _for_heads(NH, head)

  @pl.when(jnp.logical_not(body) & has_rows)
  def _fill():
    tile = _fill_value(seqs_ref, s, (BM, BP)).astype(y_ref.dtype)
    for j in range(NH):
      backend.store(y_ref.at[out_rows, pl.ds((h0 + j) * P + pid_p * BP, BP)], tile, lv)


def chunk_scan(plan: ChunkPlan, seg: Segment, slots: Slots, seqs, xr, dtr, z, A_log, D, ssm,
               y=None, carry=None):
  """The chunked scan's kernels over one segment's slots (three with `fused_pass`, one or
  two with `fused_y`).

  Args:
    plan: the launch.
    seg: the segment (`plan.segments`); slots: its view (`segment_view`).
    seqs: [7, S+1] int32 per-sequence table (`seq_table`).
    xr: [seg.body * L, C] post-conv rows of the segment's body slots, L rows per slot (zero
      past its rows).
    dtr: [seg.body * L, H] float32 processed dt of the same rows (`chunk_conv.body_conv`).
    z: optional [T, H*P] gate; A_log, D: [H] float32.
    ssm: the pool's ssm leaf; final states go over the starting slot or base in place.
    y: the previous segment's y (None for the first), written in place.
    carry: the previous segment's carried states [S, H, P, N] float32, a row per sequence
      (None for the first).

  Returns:
    (ssm, y [T, H*P] in the activation dtype with the segment's slots' rows written, the
    states carried out, None after the last segment).
  """
  cfg, t = plan.cfg, plan.tiles
  H, P, N, G, L = cfg.nheads, cfg.headdim, cfg.dstate, cfg.ngroups, plan.chunk
  S1 = plan.S + 1
  nb = seg.body
  sds = jax.ShapeDtypeStruct
  tiles_p = P // plan.local_block_p
  table = dict(seq_ref=slots.seq, row_ref=slots.row0, len_ref=slots.rows, body_ref=slots.body,
               seqs_ref=seqs)
  launch = lambda kernel, **kw: backend.pallas_call(
      lambda **refs: kernel(**refs, plan=plan), interpret=plan.interpret, **kw)
  more = seg.index < seg.count - 1
  tag = kernel_tag(plan, seg)
  passed_out = dict(ssm_out_ref=sds(ssm.shape, ssm.dtype),
                    st_ref=sds((nb, H, P, N), plan.st_dtype),
                    carry_out_ref=sds((plan.S, H, P, N), f32) if more else None)
  passing = dict(seqs_ref=seqs, carry_ref=carry if seg.index else None)
  carried = dict(ssm_ref="ssm_out_ref")
  if seg.index and more:
    carried["carry_ref"] = "carry_out_ref"
  if t.fused_y:
    return _fused_scan(plan, seg, slots, passing, passed_out, carried, launch, tag, xr, dtr,
                       z, A_log, D, ssm, y)
  sums = dict(dtr_ref=dtr, alog_ref=A_log) if t.out_acum else {}
  cb = launch(
      _chunk_cb_kernel, inputs=dict(table, xr_ref=xr, **sums),
      outputs=dict(cb_ref=sds((nb, G, L, L), f32),
                   acr_ref=sds((H, nb * L), f32) if t.out_acum else None),
      grid=(G, nb, L // plan.out_rows), num_warps=t.out_warps, num_stages=1,
      name=f"m2v_chunk_cb_{tag}")
  acr = cb.get("acr_ref")
  if t.fused_pass:
    passed = launch(
        _chunk_states_pass_kernel,
        inputs=dict(passing, xr_ref=xr, dtr_ref=dtr, alog_ref=A_log, ssm_ref=ssm,
                    acr_ref=acr),
        outputs=passed_out, aliases=carried,
        grid=(P // plan.block_p, H, S1), num_warps=t.state_warps, num_stages=t.state_stages,
        name=f"m2v_chunk_states_pass_{tag}")
  else:
    own = launch(
        _chunk_states_kernel, inputs=dict(table, xr_ref=xr, dtr_ref=dtr, alog_ref=A_log),
        outputs=dict(s_ref=sds((nb, H, P, N), f32), dec_ref=sds((nb, H), f32)),
        grid=(H // plan.state_heads * tiles_p, nb),
        num_warps=t.state_warps, num_stages=t.state_stages,
        name=f"m2v_chunk_states_{tag}")
    passed = launch(
        _chunk_pass_kernel,
        inputs=dict(passing, dec_ref=own["dec_ref"], s_ref=own["s_ref"], ssm_ref=ssm),
        outputs=passed_out, aliases=carried,
        grid=(P // plan.block_p, H, S1), num_warps=t.num_warps,
        num_stages=t.num_stages, name=f"m2v_chunk_pass_{tag}")
  out = launch(
      _chunk_out_kernel,
      inputs=dict(table, xr_ref=xr, dtr_ref=dtr, cb_ref=cb["cb_ref"],
                  st_ref=passed["st_ref"], z_ref=z if plan.has_z else None, alog_ref=A_log,
                  d_ref=D, y_in_ref=y, acr_ref=acr),
      outputs=dict(y_ref=sds((plan.T, cfg.d_inner), plan.y_dtype)),
      aliases=dict(y_in_ref="y_ref") if y is not None else None,
      grid=(H // plan.out_heads * tiles_p, seg.stop - seg.start, L // plan.out_rows),
      num_warps=t.out_warps, num_stages=t.out_stages,
      name=f"m2v_chunk_out_{tag}")
  return passed["ssm_out_ref"], out["y_ref"], passed.get("carry_out_ref")


def _fused_scan(plan: ChunkPlan, seg: Segment, slots: Slots, passing, passed_out, carried,
                launch, tag, xr, dtr, z, A_log, D, ssm, y):
  """`chunk_scan` with `ChunkTiles.fused_y`: the fused kernel, then the fill of the slots
  that are not bodies (in the last segment, where any may have rows)."""
  cfg, t = plan.cfg, plan.tiles
  sds = jax.ShapeDtypeStruct
  outputs = dict(passed_out, st_ref=None, y_ref=sds((plan.T, cfg.d_inner), plan.y_dtype))
  aliases = dict(carried, **({"y_in_ref": "y_ref"} if y is not None else {}))
  out = launch(
      _chunk_fused_kernel,
      inputs=dict(passing, row_ref=slots.row0, len_ref=slots.rows, xr_ref=xr, dtr_ref=dtr,
                  alog_ref=A_log, d_ref=D, z_ref=z if plan.has_z else None, ssm_ref=ssm,
                  y_in_ref=y),
      outputs=outputs, aliases=aliases,
      grid=(cfg.headdim // plan.block_p, cfg.nheads, plan.S + 1), num_warps=t.state_warps,
      num_stages=t.state_stages, name=f"m2v_chunk_fused_{tag}")
  y = out["y_ref"]
  host = all(isinstance(a, np.ndarray) for a in (slots.body, slots.rows))
  fills = (seg.index == seg.count - 1 and
           (not host or bool(np.any((slots.body == 0) & (slots.rows > 0)))))
  if fills:
    block = tiles_lib.pow2_divisor(cfg.d_inner, max(16, 16384 // plan.chunk))
    y = backend.pallas_call(
        lambda **refs: _fill_kernel(**refs, plan=plan, block=block),
        inputs=dict(seq_ref=slots.seq, row_ref=slots.row0, len_ref=slots.rows,
                    body_ref=slots.body, seqs_ref=passing["seqs_ref"], y_in_ref=y),
        outputs=dict(y_ref=sds(y.shape, y.dtype)), aliases=dict(y_in_ref="y_ref"),
        grid=(slots.seq.shape[0], cfg.d_inner // block), num_warps=4, num_stages=1,
        interpret=plan.interpret, name=f"m2v_chunk_fill_{tag}")["y_ref"]
  return out["ssm_out_ref"], y, out.get("carry_out_ref")

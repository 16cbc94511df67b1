"""Chunked (SSD) prefill against the serial reference, and its hand-off to both modes."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import dispatch, reference, status
from m2v_jax.kernels import backend
from m2v_jax.kernels import chunk_conv
from m2v_jax.kernels import rowmath
from m2v_jax.kernels import chunk_scan as pk
from tests.helpers import (FULL_MATRIX, matrix, assert_bitwise, assert_close,
                           assert_states_close, check_chunked_pool, copy_state, dev, every_case,
                           inputs, Pair, PRECISION_BOUND, random_state, ref_conv_prefill,
                           small_cfg)


@pytest.mark.parametrize("entry,fill", [(1, np.nan), (-1, 0.0)])
@pytest.mark.parametrize("tiles", [
    m.ChunkTiles(chunk=16), m.ChunkTiles(chunk=16, fused_pass=1, fused_y=1),
    m.ChunkTiles(chunk=16, out_rows=8, fused_pass=1, fused_y=1)])
def test_chunk_out_fills_rows_of_sequences_not_run(tiles, entry, fill):
  """The output kernel (with `fused_y`: the fused kernel, in one or two row blocks, and the
  fill kernel) fills the body rows and the rows past n of a sequence it does not run with NaN
  (rejected) or 0 (a padding entry), the rows past n of one it runs and the rows past the
  sequences with 0, and leaves the verify tails' rows alone (y starts at 7.0, which they
  keep)."""
  cfg = small_cfg()
  cap, L = cfg.capacity, 16
  # Sequence 0 runs: 40 rows, 45 reserved; sequence 1 does not: 30 rows, 33 reserved; 9
  # trailing rows.
  n, T = np.array([40, 30]), 87
  plan = pk.ChunkPlan(cfg=cfg, T=T, S=2, E=2, has_z=False, y_dtype=jnp.float32,
                      tiles=tiles, interpret=True, max_body=40)
  rb = np.maximum(n - cap, 0)
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  slots = pk.slot_table(plan, i32([0, 45, 78]), i32([40, 30, 0]), i32([45, 33, 9]),
                        i32([*rb, 0]))
  rng = np.random.default_rng(3)
  xr = dev(rng.normal(size=(plan.conv_T, cfg.conv_dim)), jnp.float32)
  dtr = dev(rng.uniform(0, 1, size=(plan.conv_T, cfg.nheads)), jnp.float32)
  p = m.random_params(cfg, 3)
  ssm = jnp.zeros((2, cap, cfg.nheads, cfg.headdim, cfg.dstate), jnp.float32)
  seg, = plan.segments
  view = pk.segment_view(slots, seg)
  seqs = pk.seq_table(i32([1, 0]), i32([0, entry]), i32([0, 0]), view)
  y0 = jnp.full((T, cfg.d_inner), 7.0, jnp.float32)
  _, y, _ = pk.chunk_scan(plan, seg, view, seqs, xr, dtr, None, p.A_log, p.D, ssm, y0)
  y = np.asarray(y)
  assert y.shape == (T, cfg.d_inner)
  assert np.all(np.isfinite(y[:rb[0]]) & (y[:rb[0]] != 7.0)), "the body of the sequence run"
  assert np.all(y[rb[0]:40] == 7.0), "its tail: left to the verify call"
  assert np.all(y[40:45] == 0.0), "its rows past n"
  assert_bitwise(y[45:45 + rb[1]], np.full_like(y[45:45 + rb[1]], fill),
                 "the body of the sequence not run")
  assert np.all(y[45 + rb[1]:75] == 7.0), "its tail: left to the verify call"
  assert_bitwise(y[75:78], np.full_like(y[75:78], fill), "its rows past n")
  assert np.all(y[78:] == 0.0), "rows past the sequences"


def test_slot_table_covers_bodies_and_fills():
  """Slots: each body in chunks that never straddle two sequences, first and count per
  sequence, then the blocks to fill; every other slot has no rows."""
  cfg = small_cfg()
  plan = pk.ChunkPlan(cfg=cfg, T=100, S=3, E=3, has_z=False, y_dtype=jnp.float32,
                      tiles=m.ChunkTiles(chunk=16), interpret=True, max_body=60)
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  t = pk.slot_table(plan, i32([0, 40, 41, 90]), i32([40, 1, 45, 0]), i32([40, 1, 49, 10]),
                    i32([32, 0, 37, 0]))
  got = [(int(s), int(r), int(k), int(b)) for s, r, k, b in zip(t.seq, t.row0, t.rows, t.body)
         if k > 0]
  assert got == [(0, 0, 16, 1), (0, 16, 16, 1), (2, 41, 16, 1), (2, 57, 16, 1), (2, 73, 5, 1),
                 (2, 86, 4, 0), (3, 90, 10, 0)]
  assert np.asarray(t.first).tolist() == [[0, 2, 2, 5]]
  assert np.asarray(t.count).tolist() == [[2, 0, 3, 0]]
  assert len(t.seq) == plan.n_slots == 100 // 16 + 2 * 4


@pytest.mark.parametrize("Rb,conv_rows,plan_rows,dtype,conv_dtype,mode", matrix([
    (43, 8, 8, jnp.float32, jnp.float32, "snapshot"),     # several blocks, padding
    (1, 1, 4, jnp.float32, jnp.float32, "compact"),       # body of 1 row; blocks of K-1 (4)
    (2, 2, 4, jnp.bfloat16, jnp.bfloat16, "snapshot"),    # body shorter than the conv state
    (5, 32, 16, jnp.bfloat16, jnp.float32, "compact"),    # one block (16 rows), mixed dtypes
    (16, 16, 16, jnp.float32, jnp.bfloat16, "snapshot"),  # one full block, no padding
    (64, 16, 16, jnp.bfloat16, jnp.bfloat16, "compact")], keep={0, 1, 2, 3, 4}))
def test_body_conv_matches_reference(Rb, conv_rows, plan_rows, dtype, conv_dtype, mode):
  """The bodies' conv kernel vs `reference.conv_prefill`, two sequences back to back: rows
  before each body from its conv state, read from the pool at its entry (and, in snapshot
  mode, starting slot; bfloat16 state or inputs too), each body in its slots' scratch rows
  (L per slot) and zero past them, its processed dt beside them. conv_rows below K-1 are
  raised, above the chunk lowered. The rows are stored in the activation dtype. Then with
  the second sequence not running: its dt rows are zero and the first sequence's rows the
  same."""
  cfg = small_cfg(mode=mode)
  B, R, L = 2, Rb + 8, 16
  rng = np.random.default_rng(Rb)
  xbc = dev(rng.normal(size=(B, R, cfg.conv_dim)), dtype)
  dt = dev(rng.normal(size=(B, R, cfg.nheads)), dtype)
  # The pool: entries in reverse order; in snapshot mode the starting slots 2 and 0.
  bank = (cfg.capacity,) if mode == "snapshot" else ()
  pool = dev(rng.normal(size=(B,) + bank + (cfg.conv_dim, cfg.d_conv - 1)), conv_dtype)
  entry, start = np.array([1, 0]), np.array([2, 0])
  conv0 = pool[entry, start] if bank else pool[entry]
  p = m.random_params(cfg, Rb)
  plan = pk.ChunkPlan(cfg=cfg, T=B * R, S=B, E=B, has_z=False, y_dtype=dtype, interpret=True,
                      tiles=m.ChunkTiles(chunk=L, conv_rows=conv_rows, conv_cols=32),
                      max_body=Rb)
  assert plan.conv_rows == plan_rows
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  base, rb = i32([0, R]), i32([Rb, Rb])
  slots = pk.slot_table(plan, i32([0, R, B * R]), i32([R, R, 0]), i32([R, R, 0]),
                        i32([Rb, Rb, 0]))
  seg, = plan.segments
  flat_x = xbc.reshape(B * R, -1)
  view = pk.segment_view(slots, seg)
  seqs = pk.seq_table(i32([1, 1]), i32(entry), i32(start), view)
  post, dtp, _ = chunk_conv.body_conv(plan, seg, view, seqs, flat_x, dt.reshape(B * R, -1),
                                      base, rb, pool, p.conv_weight, p.conv_bias, p.dt_bias)
  want, _ = ref_conv_prefill(cfg, p, conv0, xbc[:, :Rb])
  assert post.shape == (plan.conv_T, cfg.conv_dim) and dtp.shape == (plan.conv_T, cfg.nheads)
  assert post.dtype == dtype                      # rounded to the activations: stored so
  per = -(-Rb // L)                               # slots of each body
  post = np.asarray(post.astype(jnp.float32))[:B * per * L].reshape(B, per * L, -1)
  assert_close(post[:, :Rb], want, 1e-6, "post-conv rows")
  assert_bitwise(post[:, Rb:], np.zeros_like(post[:, Rb:]), "rows past the bodies")
  dtp = np.asarray(dtp)[:B * per * L].reshape(B, per * L, -1)
  want_dt = rowmath.process_dt(dt[:, :Rb].astype(jnp.float32), p.dt_bias, cfg.dt_limit)
  assert_close(dtp[:, :Rb], want_dt, 1e-6, "processed dt of the bodies")
  assert_bitwise(dtp[:, Rb:], np.zeros_like(dtp[:, Rb:]), "dt past the bodies")
  seqs = pk.seq_table(i32([1, 0]), i32(entry), i32(start), view)
  post1, dtp1, _ = chunk_conv.body_conv(plan, seg, view, seqs, flat_x, dt.reshape(B * R, -1),
                                        base, rb, pool, p.conv_weight, p.conv_bias, p.dt_bias)
  post1 = np.asarray(post1.astype(jnp.float32))[:B * per * L].reshape(B, per * L, -1)
  assert_bitwise(post1[0], post[0], "post-conv rows beside a sequence that does not run")
  dtp1 = np.asarray(dtp1)[:B * per * L].reshape(B, per * L, -1)
  assert_bitwise(dtp1[0], dtp[0], "dt beside a sequence that does not run")
  assert_bitwise(dtp1[1], np.zeros_like(dtp1[1]), "dt of a sequence that does not run")


@pytest.mark.parametrize("entry,start", [([1, 0, 2], [2, 0, 7]),      # all run
                                         ([3, -1, 0], [1, 0, 8]),      # out of pool, padding,
                                         ([0, 2, 1], [-1, 3, 0]),      # bad state_rows
                                         ([1, 0, 3, 2], [0, 7, 1, 4])])  # S+1 = 5 columns
def test_body_conv_forms_the_call_table(entry, start):
  """Snapshot, every num_rows valid (`chunk_scan.CallSeqs`): the body conv forms the table's
  runs, entry and start rows from cache_indices and state_row as `seq_table` holds them
  from `status.entry_status`, returns the whole table, and writes the same rows and dt as
  with that table."""
  cfg = small_cfg(mode="snapshot")
  B, Rb, L = len(entry), 20, 16
  R = Rb + cfg.capacity
  rng = np.random.default_rng(3)
  xbc = dev(rng.normal(size=(B * R, cfg.conv_dim)), jnp.float32)
  dt = dev(rng.normal(size=(B * R, cfg.nheads)), jnp.float32)
  pool = dev(rng.normal(size=(B, cfg.capacity, cfg.conv_dim, cfg.d_conv - 1)), jnp.float32)
  p = m.random_params(cfg, 3)
  plan = pk.ChunkPlan(cfg=cfg, T=B * R, S=B, E=B, has_z=False, y_dtype=jnp.float32,
                      interpret=True, tiles=m.ChunkTiles(chunk=L), max_body=Rb)
  base, n = np.arange(B, dtype=np.int32) * R, np.full((B,), R, np.int32)
  rb = n - cfg.capacity
  slots = pk.slot_table(plan, *(pk.with_trailing(a, v) for a, v in
                                ((base, B * R), (n, 0), (n, 0), (rb, 0))))
  seg, = plan.segments
  view = pk.segment_view(slots, seg)
  ci, row = jnp.asarray(entry, jnp.int32), jnp.asarray(start, jnp.int32)
  state = m.init_state(cfg, B, jnp.float32)
  _, valid, _ = status.entry_status(cfg, state, R, status.call_args(
      jnp.zeros((B, R, cfg.conv_dim)), None, row, None, ci, n))
  want = pk.seq_table(valid, ci, jnp.where(valid, row, 0), view)
  zero = np.zeros((B,), np.int32)
  call = pk.CallSeqs(pk.seq_table(zero, zero, zero, view), ci, row)
  args = (xbc, dt, base, rb, pool, p.conv_weight, p.conv_bias, p.dt_bias)
  post, dtp, table = chunk_conv.body_conv(plan, seg, view, call, *args)
  post0, dtp0, same = chunk_conv.body_conv(plan, seg, view, want, *args)
  assert same is want
  assert_bitwise(table, want, "the table")
  runs = np.repeat(np.asarray(valid), -(-Rb // L) * L)          # each body's slots' rows
  assert_bitwise(np.asarray(post)[:runs.size][runs], np.asarray(post0)[:runs.size][runs],
                 "post-conv rows of the sequences that run")
  assert_bitwise(dtp, dtp0, "processed dt")


def test_scratch_limit_cuts_long_bodies_into_segments():
  """At Bolt's bf16 table (`scratch_mb` 100 a sequence): R=8192, 173 MB in one scan, runs in
  two segments within the limit (the carried states counted), R=512 and 4096 in one; B=2 has
  twice the limit; scratch_mb=0 keeps one scan. The segments tile the slot table once, in
  order, each with scratch for its `segment_slots`; each holds the next part of every body,
  so a padded B=2 call runs both sequences in every segment. A limit that no count of
  segments meets is an error that names the least it takes."""
  tiles = m.chunk_tile_config(m.BOLT, "bf16")
  assert tiles.scratch_mb == 100
  plan = lambda R, B=1, t=tiles: pk.ChunkPlan(cfg=m.BOLT, T=B * R, S=B, E=B, has_z=False,
                                              y_dtype=jnp.bfloat16, tiles=t,
                                              max_body=R - m.BOLT.capacity)
  one = plan(8192, t=dataclasses.replace(tiles, scratch_mb=0))
  assert len(one.segments) == 1 and 173e6 < pk.scratch_bytes(one) < 174e6
  for R, B, count in ((512, 1, 1), (4096, 1, 1), (8192, 1, 2), (8192, 2, 2), (13700, 1, 4)):
    p = plan(R, B)
    segs = p.segments
    assert len(segs) == count, (R, B)
    assert pk.scratch_bytes(p) <= B * 100e6
    assert [s.start for s in segs] == [0] + [s.stop for s in segs[:-1]]
    assert segs[-1].stop == p.n_slots and p.body_slots == count * p.segment_slots
    assert all(s.body == p.segment_slots == s.stop - s.start for s in segs[:-1])
  p = plan(8192, 2)
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  rb = 8192 - m.BOLT.capacity
  t = pk.slot_table(p, i32([0, 8192, 16384]), i32([8192, 8192, 0]), i32([8192, 8192, 0]),
                    i32([rb, rb, 0]))
  half = 64                      # each segment's 64-row slots of a body of 8184 rows (128)
  assert np.asarray(t.count).tolist() == [[half, half, 0], [half, half, 0]]
  assert np.asarray(t.carry_out).tolist() == [[1, 1, 0], [0, 0, 0]]
  body = np.asarray(t.body)
  assert body.sum() == 4 * half and np.all(np.flatnonzero(body) < p.body_slots)
  assert plan(4096, 2, dataclasses.replace(tiles, scratch_mb=1.13)).scratch_budget == 2_260_000
  small = plan(4096, t=dataclasses.replace(tiles, scratch_mb=3))
  with pytest.raises(ValueError, match=r"scratch_mb=3: a chunk's scratch .* 5\.54 MB"):
    small.segments


def test_chunk_heads_keep_the_grid_full():
  """Heads per chunk-states program: the table's 16 at Bolt for a long body, fewer when the
  grid would fall below MIN_LOCAL_PROGRAMS programs (short bodies), never below one; the
  output kernel's (1 in the table) the same rule."""
  tiles = m.chunk_tile_config(m.BOLT)
  plan = lambda Rb, B=1, t=tiles: pk.ChunkPlan(cfg=m.BOLT, T=B * (Rb + 8), S=B, E=B,
                                               has_z=False, y_dtype=jnp.bfloat16, tiles=t,
                                               max_body=Rb)
  assert (tiles.state_heads, tiles.out_heads) == (16, 1)
  assert [plan(Rb).state_heads for Rb in (4088, 504, 29)] == [16, 2, 1]
  assert plan(504, B=4).state_heads == 8
  assert [plan(Rb).out_heads for Rb in (4088, 504, 29)] == [1, 1, 1]
  wide = dataclasses.replace(tiles, out_heads=8)
  assert [plan(Rb, t=wide).out_heads for Rb in (4088, 504)] == [8, 2]
  for Rb in (4088, 504):
    p = plan(Rb)
    assert m.BOLT.nheads // p.state_heads * (p.T // p.chunk) >= pk.MIN_LOCAL_PROGRAMS


@pytest.mark.parametrize("fields,match", [
    (dict(chunk=48), "power of two"),
    (dict(num_stages=0), "num_stages"),
    (dict(state_stages=0), "state_stages"),
    (dict(out_stages=0), "out_stages"),
    (dict(state_heads=3), "state_heads: expected a power of two"),
    (dict(out_warps=6), "out_warps: expected a power of two"),
    (dict(conv_cols=96), "conv_cols: expected a power of two"),
    (dict(local_block_p=24), "local_block_p: expected a power of two"),
    (dict(fused_pass=2), "fused_pass: expected 0 or 1"),
    (dict(out_acum=2), "out_acum: expected 0 or 1"),
    (dict(fused_y=2), "fused_y: expected 0 or 1"),
    (dict(fused_y=1), "fused_y=1 needs fused_pass=1"),
    (dict(out_cols=24), "out_cols: expected 0 or a power of two up to out_rows"),
    (dict(out_rows=32, out_cols=64), "out_cols: expected 0 or a power of two up to out_rows"),
    (dict(scratch_mb=-1), "scratch_mb: expected a finite value >= 0"),
    (dict(scratch_mb=float("inf")), "scratch_mb: expected a finite value >= 0")])
def test_chunk_tiles_are_checked(fields, match):
  with pytest.raises(ValueError, match=match):
    m.ChunkTiles(**fields)


def test_chunk_tiles_from_text():
  table = m.ChunkTiles(chunk=128, block_p=64, state_heads=16, fused_pass=1)
  assert m.ChunkTiles.from_text("128:64:state_heads=16:fused_pass=1") == table
  assert m.ChunkTiles.from_text("64:16:4:scratch_mb=12.5").scratch_mb == 12.5
  for text in ("128:out_rows=32:64", "chunk=64:chunk=128", "size=4", "128:x", "1:" * 30 + "1"):
    with pytest.raises(ValueError, match="chunk tiles: expected"):
      m.ChunkTiles.from_text(text)


# Distinct stand-ins for the thresholds, so that a branch that picks another one fails.
_THRESHOLDS = {"MIN_CHUNKED_ROWS": 23, "MIN_CHUNKED_ROWS_BF16": 11,
               "MIN_CHUNKED_ROWS_BF16_BATCHED": 13, "MIN_CHUNKED_ROWS_BF16_KERNELS": 17,
               "MIN_CHUNKED_ROWS_BF16_KERNELS_BATCHED": 19,
               "MIN_CHUNKED_ROWS_HIGHEST_BF16": 29, "MIN_CHUNKED_ROWS_HIGHEST_BF16_BATCHED": 37,
               "MIN_CHUNKED_ROWS_HIGHEST_BF16_WIDE": 41,
               "MIN_CHUNKED_ROWS_F32": 31}


@pytest.mark.parametrize("nheads, act, precision, batch, threshold", [
    (128, jnp.bfloat16, None, 1, "MIN_CHUNKED_ROWS_BF16"),
    (128, jnp.bfloat16, None, 8, "MIN_CHUNKED_ROWS_BF16_BATCHED"),
    (128, jnp.bfloat16, "highest", 1, "MIN_CHUNKED_ROWS_HIGHEST_BF16"),
    (128, jnp.bfloat16, "highest", 2, "MIN_CHUNKED_ROWS_HIGHEST_BF16_BATCHED"),
    (128, jnp.bfloat16, "highest", 3, "MIN_CHUNKED_ROWS_HIGHEST_BF16_BATCHED"),
    (128, jnp.bfloat16, "highest", 4, "MIN_CHUNKED_ROWS_HIGHEST_BF16_WIDE"),
    (128, jnp.bfloat16, "highest", 8, "MIN_CHUNKED_ROWS_HIGHEST_BF16_WIDE"),
    (128, jnp.float16, "highest", 1, "MIN_CHUNKED_ROWS"),
    (128, jnp.float16, "highest", 8, "MIN_CHUNKED_ROWS"),
    (128, jnp.float32, None, 2, "MIN_CHUNKED_ROWS_F32"),
    (128, jnp.float32, "tf32", 1, "MIN_CHUNKED_ROWS_F32"),
    (128, jnp.float32, "bf16", 1, "MIN_CHUNKED_ROWS_BF16"),
    (128, jnp.float32, "bf16", 2, "MIN_CHUNKED_ROWS_BF16_BATCHED"),
    (128, jnp.bfloat16, "tf32", 1, "MIN_CHUNKED_ROWS"),
    (128, jnp.float16, None, 1, "MIN_CHUNKED_ROWS"),
    # Bolt split over 2 devices: the scan in three kernels (no one-kernel entry)
    (64, jnp.bfloat16, None, 1, "MIN_CHUNKED_ROWS_BF16_KERNELS"),
    (64, jnp.bfloat16, None, 4, "MIN_CHUNKED_ROWS_BF16_KERNELS_BATCHED"),
    (64, jnp.bfloat16, "highest", 1, "MIN_CHUNKED_ROWS"),
    (64, jnp.bfloat16, "highest", 4, "MIN_CHUNKED_ROWS")])
def test_prefill_path_by_body_rows(monkeypatch, nheads, act, precision, batch, threshold):
  """A Bolt prefill takes the chunked path from its threshold of body rows on, by activation
  dtype, product precision, batch (bf16 products, and "highest" with bfloat16 activations)
  and whether the table runs the scan in one kernel; `chunked` given overrides it."""
  for name, value in _THRESHOLDS.items():
    monkeypatch.setattr(dispatch, name, value)
  min_rows = _THRESHOLDS[threshold]
  cfg = m.BOLT.replace(nheads=nheads, prefill_precision=precision)
  cap = cfg.capacity
  use = lambda R, chunked=None, backend="pallas": dispatch.use_chunked(
      cfg, backend, R, chunked, act, batch=batch)
  assert not use(cap + min_rows - 1)
  assert use(cap + min_rows)
  assert use(cap + 1, True)
  assert not use(cap + min_rows, False)
  assert not use(cap + min_rows, backend="reference")


def test_prefill_thresholds_cover_the_constants():
  """The stand-ins above name every threshold `dispatch` has."""
  assert set(_THRESHOLDS) == {k for k in vars(dispatch) if k.startswith("MIN_CHUNKED_ROWS")}


@pytest.mark.parametrize("B", [1, 3])
def test_prefill_passes_its_batch_to_the_path_choice(monkeypatch, B):
  """`prefill` asks `dispatch.use_chunked` with its call's sequence count."""
  seen = []
  choose = dispatch.use_chunked
  monkeypatch.setattr(dispatch, "use_chunked",
                      lambda *a, **kw: seen.append(kw.get("batch")) or choose(*a, **kw))
  cfg = small_cfg()
  rng = np.random.default_rng(3)
  xbc, dt = inputs(cfg, B, cfg.capacity + 4, rng=rng)
  m.prefill(cfg, m.random_params(cfg), random_state(cfg, B, rng=rng), xbc, dt,
            np.zeros(B, np.int32), backend="reference")
  assert seen == [B]


def test_a_ragged_call_off_the_chunked_path_is_rejected():
  """`dispatch.call` hands a ragged prefill off at num_rows only on the chunked path."""
  cfg = small_cfg()
  p, state, args = dispatch.abstract_call_args(cfg, 2, cfg.capacity + 4, dtype=jnp.float32)
  with pytest.raises(ValueError, match="ragged=True .* needs chunked=True"):
    dispatch.call(p, state, args, cfg=cfg, backend="interpret", chunked=False, ragged=True)


def test_chunk_shorter_than_conv_state_is_rejected():
  with pytest.raises(ValueError, match="below the conv state"):
    pk.ChunkPlan(cfg=small_cfg(), T=48, S=1, E=1, has_z=False, y_dtype=jnp.float32,
                 tiles=m.ChunkTiles(chunk=2), interpret=True)


@pytest.mark.parametrize("R,chunk", [(100, 16), (37, 64)])     # (37, 64): T below a chunk
def test_a_scratch_limit_too_small_is_rejected_and_leaves_the_state(R, chunk):
  """`prefill` with a `scratch_mb` that no count of segments meets: ValueError naming the least
  it takes, raised while tracing, so the donated pool is neither consumed nor changed; that
  least, asked for, is enough."""
  cfg = small_cfg(headdim=16)
  p = m.random_params(cfg, 2)
  rng = np.random.default_rng(2)
  state = random_state(cfg, 1, rng=rng)
  before = copy_state(state)
  xbc, dt = inputs(cfg, 1, R, rng=rng)
  run = lambda mb: m.prefill(cfg, p, state, xbc, dt, [0], backend="interpret", chunked=True,
                             chunk_tiles=m.ChunkTiles(chunk=chunk, scratch_mb=mb))
  with pytest.raises(ValueError, match=r"scratch_mb=1e-05: a chunk's scratch per sequence") as e:
    run(1e-5)
  for name, a, b in zip(type(state)._fields, state, before):
    assert_bitwise(a, b, name)
  least = float(re.search(r"need ([0-9.]+) MB", str(e.value)).group(1))
  plan = dispatch.chunk_plan(cfg, "interpret", state, R, 1, jnp.float32, False,
                             R - cfg.capacity, m.ChunkTiles(chunk=chunk, scratch_mb=least))
  assert plan.segment_count >= 1 and pk.scratch_bytes(plan) <= plan.scratch_budget


class PrefillChecks:
  """Chunked prefill against the reference (compiled and interpret variants below)."""

  backend: str

  def prefill_both(self, cfg, p, state, xbc, dt, rows, z=None, chunk_tiles=None):
    """(y, state) of a chunked prefill on this backend (`chunk_tiles`: its tiles, else the
    table's) and of the reference's, from copies of `state`: ((y, got), (y_ref, want))."""
    ref_state = type(state)(*map(jnp.asarray, copy_state(state)))
    want = m.prefill(cfg, p, ref_state, xbc, dt, rows, z=z, backend="reference")
    return m.prefill(cfg, p, state, xbc, dt, rows, z=z, backend=self.backend, chunked=True,
                     chunk_tiles=chunk_tiles), want

  @pytest.mark.parametrize("mode,R,capacity", matrix([("snapshot", 9, 8), ("snapshot", 17, 16),
                                                      ("snapshot", 77, 8), ("compact", 37, 8),
                                                      ("compact", 77, 16), ("snapshot", 10, 8),
                                                      ("snapshot", 29, 5)], keep={0, 4, 5, 6}))
  def test_chunked_matches_reference(self, mode, R, capacity):
    """R just above the capacity, not a multiple of the chunk, several starting states; a
    body shorter than the conv window (R=10: the tail's window partly the state's), a
    capacity below the dual form's tile rows (5 of 8: the tail's y stored row by row)."""
    cfg = small_cfg(mode=mode, capacity=capacity, headdim=16)
    p = m.random_params(cfg, R)
    rng = np.random.default_rng(R)
    B = 3
    state = random_state(cfg, B, rng=rng)
    if mode == "compact":      # leave rows pending so the pre-pass has work
      xbc, dt = inputs(cfg, B, capacity, rng=rng)
      _, state = m.verify(cfg, p, state, xbc, dt, [0] * B, backend="reference")
    rows = np.array([0, capacity - 1, 3], np.int32)
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    (y, got), (y_ref, want) = self.prefill_both(cfg, p, state, xbc, dt, rows, z)
    assert_close(y, y_ref, 1e-5, "y")
    assert_states_close(got, want, 1e-5)

  @pytest.mark.parametrize("act,tiles", matrix([
      (jnp.bfloat16, None), (jnp.float16, None),
      (jnp.bfloat16, m.ChunkTiles(chunk=32, out_rows=32, fused_pass=1, fused_y=1))],
      keep={0, 2}))
  def test_highest_products_keep_float32_accuracy(self, monkeypatch, act, tiles):
    """"highest" products with 16-bit activations (`ChunkPlan.products`, post-conv rows
    whole: bf16 passes on the float32 operands' three parts with bfloat16, a TF32 head and
    middle with float16; interpreted with bfloat16, the passes the tensor cores would run,
    as XLA:CPU has no TF32 dot), in the three kernels and in the whole scan in one
    (`fused_y`): the final state and y within the "highest" bounds of the reference (y's
    16-bit roundings mostly agree; one bf16 part alone errs by ~1e-3)."""
    if self.backend == "interpret" and act == jnp.bfloat16:
      real = pk.ChunkPlan.products
      monkeypatch.setattr(pk.ChunkPlan, "products", property(
          lambda plan: real.fget(plan) and backend.Products(True, tensor_cores=True,
                                                            bf16_rows=True)))
    cfg = small_cfg(mode="compact", headdim=16).replace(prefill_precision="highest")
    p = m.random_params(cfg, 9)
    rng = np.random.default_rng(9)
    B, R = 2, 200
    state = random_state(cfg, B, act, rng=rng)
    xbc, dt = inputs(cfg, B, R, act, rng=rng)
    (y, got), (y_ref, want) = self.prefill_both(cfg, p, state, xbc, dt, [0, 0],
                                                chunk_tiles=tiles)
    st_bound, y_bound = PRECISION_BOUND["highest"]
    assert_close(got.ssm, want.ssm, st_bound, "ssm")
    assert_close(y.astype(jnp.float32), y_ref.astype(jnp.float32), y_bound, "y")

  def test_chunk_extreme_decays(self):
    """Head 0's A = -1e4 (every decay past a row's own underflows; dt near 2, so that the
    diagonal term weighs in y), head 1's A = -1e-3 (decays near one): against the reference."""
    cfg = small_cfg(headdim=16)
    p = m.random_params(cfg, 23)
    p = p._replace(A_log=p.A_log.at[0].set(np.log(1e4)).at[1].set(np.log(1e-3)),
                   dt_bias=p.dt_bias.at[0].set(2.0))
    rng = np.random.default_rng(23)
    B, R = 2, 77
    state = random_state(cfg, B, rng=rng)
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    (y, got), (y_ref, want) = self.prefill_both(cfg, p, state, xbc, dt, [0, 5], z)
    assert_close(y, y_ref, 1e-5, "y")
    P = cfg.headdim
    assert_close(y[..., :P], y_ref[..., :P], 1e-5, "y of head 0")
    assert_states_close(got, want, 1e-5)

  @pytest.mark.parametrize("extreme", matrix([False, True], keep={0, 1}))
  def test_fused_y_bf16_weights(self, monkeypatch, extreme):
    """`fused_y` at "bf16" products (bfloat16 activations) weighs each causal entry with one
    exp2 of a_t - b_s, log2(dt) inside b, in 16-row blocks with 16-column sums and in whole
    32-row chunks: y and the states within the bf16 bounds of the reference and of the
    output kernel (fused_y=0, exp(min(acum_t - acum_s, 0)) dt). `extreme`: head 0's A =
    -1e4 with dt near 2 (every weight past the diagonal underflows), head 1's A = -1e-3."""
    monkeypatch.setattr(pk, "MIN_LOCAL_PROGRAMS", 1)
    cfg = small_cfg(headdim=16)
    assert cfg.prefill_precision_for(jnp.bfloat16) == "bf16"        # the exp2 weights'
    p = m.random_params(cfg, 29)
    if extreme:
      p = p._replace(A_log=p.A_log.at[0].set(np.log(1e4)).at[1].set(np.log(1e-3)),
                     dt_bias=p.dt_bias.at[0].set(2.0))
    rng = np.random.default_rng(29)
    B, R = 2, 83                                      # bodies of 75 and 70 rows: a partial slot
    state = random_state(cfg, B, rng=rng)
    start = copy_state(state)
    xbc, dt, z = inputs(cfg, B, R, jnp.bfloat16, rng=rng, z=True)
    rows = np.array([0, 5], np.int32)
    ref_state = type(state)(*map(jnp.asarray, start))
    y_ref, want = m.prefill(cfg, p, ref_state, xbc, dt, rows, z=z, backend="reference")
    st_bound, y_bound = PRECISION_BOUND["bf16"]
    for tiles in (m.ChunkTiles(chunk=32, out_rows=16, out_cols=16, fused_pass=1, fused_y=1),
                  m.ChunkTiles(chunk=32, out_rows=32, out_cols=32, fused_pass=1, fused_y=1)):
      got = {}
      for fused_y in (1, 0):
        got[fused_y] = m.prefill(cfg, p, type(state)(*map(jnp.asarray, start)), xbc, dt, rows,
                                 z=z, backend=self.backend, chunked=True,
                                 chunk_tiles=dataclasses.replace(tiles, fused_y=fused_y))
      (y, new), (y0, old) = got[1], got[0]
      f = lambda a: jnp.asarray(a, jnp.float32)
      assert_close(f(y), f(y_ref), y_bound, f"y, {tiles.out_rows}-row blocks")
      assert_close(new.ssm, want.ssm, st_bound, f"ssm, {tiles.out_rows}-row blocks")
      assert_close(f(y), f(y0), y_bound, f"y against the output kernel's, {tiles.out_rows}")
      assert_close(new.ssm, old.ssm, 1e-6, "ssm against the fused pass and output kernel")

  @pytest.mark.parametrize("ngroups,nheads,tiles,heads", [
      (2, 4, m.ChunkTiles(chunk=16, block_p=4, local_block_p=16, state_heads=2,
                          state_stages=2, out_heads=2, out_stages=2), (2, 2)),
      (2, 4, m.ChunkTiles(chunk=32, block_p=1, state_heads=4, out_heads=1, out_warps=8,
                          out_rows=16), (2, 1)),
      (1, 4, m.ChunkTiles(chunk=16, state_heads=1, out_heads=4, fused_pass=1), (1, 4)),
      (2, 4, m.ChunkTiles(chunk=64, out_rows=16), (1, 1)),
      (2, 6, m.ChunkTiles(chunk=32, out_rows=16, out_cols=16, out_acum=1, out_stages=2,
                          fused_pass=1), (1, 1)),
      (2, 6, m.ChunkTiles(chunk=32, out_rows=16, out_cols=16, fused_pass=1, fused_y=1),
       (1, 1)),
      (1, 4, m.ChunkTiles(chunk=32, block_p=16, out_rows=32, fused_pass=1, fused_y=1,
                          state_warps=8), (1, 1))])
  def test_chunk_tiles_match_reference(self, monkeypatch, ngroups, nheads, tiles, heads):
    """Other launch parameters, same results: several heads (shrunk to the heads of a group)
    and P tiles per chunk-states and output program, state-passing P tiles down to one row, 3
    chunks of 16, 2 chunks of 32 or one of 64 in output blocks of 16 rows (up to 3 column
    blocks a program; its dots are 16 wide, so the GPU suite runs it compiled), or 2 chunks
    of 32 in 16-row blocks with column blocks of 16 and the cumulative dt·A loaded by the
    fused pass and the output kernel (against the kernels' own sums too), 3 heads a group
    (the C·Bᵀ kernel sums them in 3 scans of one); chunk states and passing fused, against
    the two kernels too (interpreted with the full matrix also in P tiles of 4); or y in the
    fused pass (`fused_y`), in 16-row blocks with 16-column sums or in whole 32-row chunks
    at 8 warps, against the output kernel. The small grid would make the plan drop to one
    head a program: the program-count floor is lifted."""
    monkeypatch.setattr(pk, "MIN_LOCAL_PROGRAMS", 1)
    cfg = small_cfg(ngroups=ngroups, headdim=16, nheads=nheads)
    plan = pk.ChunkPlan(cfg=cfg, T=2 * 51, S=2, E=2, has_z=True, y_dtype=jnp.float32,
                        tiles=tiles, interpret=True, max_body=43)
    assert (plan.state_heads, plan.out_heads) == heads
    p = m.random_params(cfg, 41)
    rng = np.random.default_rng(41)
    B, R = 2, 51                                       # body 43 rows: 3 chunks of 16
    state = random_state(cfg, B, rng=rng)
    rows = np.array([2, 6], np.int32)
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    start = copy_state(state)
    ref_state = type(state)(*map(jnp.asarray, start))
    y_ref, want = m.prefill(cfg, p, ref_state, xbc, dt, rows, z=z, backend="reference")
    y, got = m.prefill(cfg, p, state, xbc, dt, rows, z=z, backend=self.backend, chunked=True,
                       chunk_tiles=tiles)
    assert_close(y, y_ref, 1e-5, "y")
    assert_close(got.ssm, want.ssm, 1e-5, "ssm")
    assert_close(got.conv, want.conv, 1e-6, "conv")
    same = assert_bitwise if self.backend == "interpret" else (
        lambda a, b_, what: assert_close(a, b_, 1e-6, what))

    def again(**fields):
      return m.prefill(cfg, p, type(state)(*map(jnp.asarray, start)), xbc, dt, rows, z=z,
                       backend=self.backend, chunked=True,
                       chunk_tiles=dataclasses.replace(tiles, **fields))

    if tiles.out_acum:               # the decay summed in the output kernel instead
      y0, _ = again(out_acum=0)
      assert_close(y, y0, 1e-6, "y, acum loaded against summed in the kernel")
    if tiles.fused_y:                # y in the fused pass against the output kernel's
      y3, three = again(fused_y=0)
      assert_close(y, y3, 1e-6, "y, from the fused pass against the output kernel")
      assert_close(got.ssm, three.ssm, 1e-6, "ssm, fused_y against fused_pass alone")
    elif tiles.fused_pass:           # the same products and sums as the two kernels
      y2, two = again(fused_pass=0)
      same(y, y2, "y, fused against two kernels")
      same(got.ssm, two.ssm, "ssm, fused against two kernels")
      if self.backend == "interpret" and FULL_MATRIX:   # 4 P tiles (compiled dots: 16 rows)
        y4, four = again(block_p=4)
        assert_close(y4, y2, 1e-6, "y, fused in P tiles of 4")
        assert_close(four.ssm, two.ssm, 1e-6, "ssm, fused in P tiles of 4")

  @pytest.mark.parametrize("mode,scratch_mb", matrix(
      [("snapshot", 0.03), ("compact", 0), ("snapshot", 0), ("compact", 0.03)], keep={0, 1}))
  def test_host_layout_equals_the_device_one(self, mode, scratch_mb):
    """A prefill without `num_rows` (its slot table and tails' rows built on the host) against
    the same prefill with `num_rows` = R for all (built on the device), bitwise: y and the
    pool, with a padding entry, in one scan or several segments."""
    cfg = small_cfg(mode=mode, headdim=16)
    p = m.random_params(cfg, 46)
    rng = np.random.default_rng(46)
    B, R = 3, 83
    state = random_state(cfg, B, rng=rng)
    start = copy_state(state)
    rows = np.array([2, 0, 5] if mode == "snapshot" else [0, 0, 0], np.int32)
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    tiles = m.ChunkTiles(chunk=16, scratch_mb=scratch_mb)
    plan = dispatch.chunk_plan(cfg, self.backend, state, B * R, B, jnp.float32, True,
                               R - cfg.capacity, tiles)
    assert (len(plan.segments) > 1) == (scratch_mb > 0)

    def run(num_rows=None):
      return m.prefill(cfg, p, type(state)(*map(jnp.asarray, start)), xbc, dt, rows, z=z,
                       cache_indices=[2, -1, 0], num_rows=num_rows, backend=self.backend,
                       chunked=True, chunk_tiles=tiles)

    y, got = run()
    y2, want = run(jnp.full((B,), R, jnp.int32))
    assert np.all(np.isfinite(np.asarray(y)[[0, 2]])), "the sequences run"
    assert_bitwise(y, y2, "y")
    for name, a, b_ in zip(type(got)._fields, got, want):
      assert_bitwise(a, b_, name)

  def test_modes_bitwise_across_chunked_prefill(self, monkeypatch):
    """With the chunked body, snapshot and compact still agree bitwise after every call."""
    for name in _THRESHOLDS:
      monkeypatch.setattr(dispatch, name, 1)                # chunked from R = cap + 1
    pair = Pair(self.backend, seed=21, B=2, cfg=small_cfg(headdim=16))
    pair.call(8)
    pair.accept([5, 1])
    pair.call(77)                     # pre-pass fold, chunked body, serial tail
    pair.accept([7, 4])
    pair.call(8)
    pair.accept([3, 3])

  def test_one_prefill_equals_prefill_then_verify(self):
    """Prefill P rows in one call vs P-k rows then a fully accepted k-row verify."""
    cfg = small_cfg(mode="compact", headdim=16)
    p = m.random_params(cfg, 22)
    rng = np.random.default_rng(22)
    B, P, k = 2, 100, 6
    xbc, dt = inputs(cfg, B, P, rng=rng)
    one = m.init_state(cfg, B, jnp.float32)
    _, one = m.prefill(cfg, p, one, xbc, dt, [0, 0], backend=self.backend, chunked=True)
    two = m.init_state(cfg, B, jnp.float32)
    _, two = m.prefill(cfg, p, two, xbc[:, :P - k], dt[:, :P - k], [0, 0], backend=self.backend,
                       chunked=True)
    _, two = m.verify(cfg, p, two, xbc[:, P - k:], dt[:, P - k:], [7, 7], backend=self.backend)
    a = m.committed_state(cfg, p, one, [7, 7], backend=self.backend)
    b = m.committed_state(cfg, p, two, [k - 1, k - 1], backend=self.backend)
    assert_close(a[0], b[0], 1e-5, "ssm")
    assert_close(a[1], b[1], 1e-6, "conv")

  @pytest.mark.parametrize("mode,R", matrix([("snapshot", 77), ("snapshot", 72), ("compact", 77),
                                              ("compact", 72)], keep={1, 2}))
  def test_chunked_pool_padding_invalid_and_nan(self, mode, R):
    """`check_chunked_pool` at R = 77: the body's padded chunks reach past R (the kernels' y is
    cut to R rows, z padded), the bad state_row -1; R = 72: they do not (z and y used in
    place), the bad state_row the capacity (in snapshot mode the tail's launch, which gets
    state_row as is, rejects it)."""
    cfg = small_cfg(mode=mode, headdim=16)
    check_chunked_pool(self.backend, cfg, R, bad_row=-1 if R == 77 else cfg.capacity)


  @pytest.mark.parametrize("precision,dtype", matrix([
      (None, jnp.float32), ("tf32", jnp.float32), ("bf16", jnp.float32), (None, jnp.bfloat16),
      ("highest", jnp.bfloat16), ("tf32", jnp.float16)], keep={1, 3}))
  def test_prefill_precision(self, precision, dtype):
    """The chunked body at each product precision against the serial recurrence (float32
    math on the same inputs): the final state within the precision's bound (PRECISION_BOUND)
    and, for the rounded products, above 1e-6 (the rounding happens: a forgotten precision
    fails); y within its bound."""
    cfg = small_cfg(mode="compact", headdim=16).replace(prefill_precision=precision)
    used = cfg.prefill_precision_for(dtype)
    assert used == (precision or {"float32": "highest", "bfloat16": "bf16"}[jnp.dtype(dtype).name])
    p = m.random_params(cfg, 4)
    rng = np.random.default_rng(4)
    B, R = 2, 200
    state = random_state(cfg, B, dtype, rng=rng)
    xbc, dt = inputs(cfg, B, R, dtype, rng=rng)
    (y, got), (y_ref, want) = self.prefill_both(cfg, p, state, xbc, dt, np.zeros(B, np.int32))
    st_bound, y_bound = PRECISION_BOUND[used]
    assert_close(got.ssm, want.ssm, st_bound, "ssm")
    assert_close(y.astype(jnp.float32), y_ref.astype(jnp.float32),
                 max(y_bound, 1e-2 if dtype != jnp.float32 else 0), "y")
    if used != "highest":
      err = np.linalg.norm(np.asarray(got.ssm - want.ssm)) / np.linalg.norm(np.asarray(want.ssm))
      assert err > 1e-6, f"{used}: error {err:.1e}, as if the products were not rounded"


  @pytest.mark.parametrize("mode,window", matrix([("snapshot", None), ("compact", None),
                                                  ("compact", 16)], keep={2}))
  def test_ragged_prefill(self, mode, window):
    """A ragged prefill (per-sequence num_rows, R = 77 > capacity 8; a padding sequence,
    lengths from 3 to 77, the gate on) against the reference (one call per length), then
    against each sequence's own prefill of its n rows on this backend (bitwise in interpret
    mode: the same kernels; compiled, XLA's batched C·Bᵀ between them has another batch
    shape, so float32 rounding apart; interpreted, each length is another program: only the
    sequence of capacity + 1 rows, unless M2V_FULL_MATRIX=1), then one verify
    call from mixed rows, which must agree as well (the hand-off)."""
    cfg = small_cfg(mode=mode, headdim=16).replace(window=window)
    p = m.random_params(cfg, 9)
    rng = np.random.default_rng(9)
    B, R, E = 6, 77, 8
    n = np.array([77, 9, 64, 3, 64, 8], np.int32)      # sequence 2: padding, n < R
    idx = np.array([5, 0, -1, 2, 7, 3], np.int32)
    state = random_state(cfg, E, rng=rng)
    if cfg.compact:                       # rows pending: folded first, or replayed (n <= 8)
      xw, dw = inputs(cfg, B, 8, rng=rng)
      _, state = m.verify(cfg, p, state, xw, dw, [0] * B, cache_indices=idx, backend="reference")
    rows = np.array([0, 3, 0, 5, 7, 2], np.int32)
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    ref = type(state)(*map(jnp.asarray, copy_state(state)))
    sep = type(state)(*map(jnp.asarray, copy_state(state)))
    y_ref, ref = m.prefill(cfg, p, ref, xbc, dt, rows, z=z, cache_indices=idx, num_rows=n,
                           backend="reference")
    y, got = m.prefill(cfg, p, state, xbc, dt, rows, z=z, cache_indices=idx, num_rows=n,
                       backend=self.backend)
    assert_close(y, y_ref, 1e-5, "y")
    assert_bitwise(y[2], jnp.zeros_like(y[2]), "padding sequence")
    for b in range(B):
      assert_bitwise(y[b, n[b]:], jnp.zeros_like(y[b, n[b]:]), f"rows past n of {b}")
    assert_states_close(got, ref, 1e-5)
    same = assert_bitwise if self.backend == "interpret" else (
        lambda a, b_, what: assert_close(a, b_, 1e-6, what))
    real = np.flatnonzero(idx >= 0)
    cap = cfg.capacity
    seqs = real if every_case(self.backend) else [b for b in real if n[b] == cap + 1]
    for b in seqs:
      k = int(n[b])
      one = np.full(B, -1, np.int32)
      one[b] = idx[b]
      y1, sep = m.prefill(cfg, p, sep, xbc[:, :k], dt[:, :k], rows, z=z[:, :k],
                          cache_indices=one, backend=self.backend, chunked=k > 8 or None)
      same(y[b, :k], y1[b], f"y of sequence {b} (n={k})")
    entries = np.setdiff1d(np.arange(E), idx[np.setdiff1d(real, seqs)])    # all but skipped
    for name, a, b_ in zip(type(got)._fields, got, sep):
      (same if a.dtype == jnp.float32 else assert_bitwise)(np.asarray(a)[entries],
                                                           np.asarray(b_)[entries], name)
    nxt = np.array([3, 0, 0, 1, 7, 2], np.int32)
    xv, dv = inputs(cfg, B, 8, rng=rng)
    y_ref, ref = m.verify(cfg, p, ref, xv, dv, nxt, cache_indices=idx, backend="reference")
    y, got = m.verify(cfg, p, got, xv, dv, nxt, cache_indices=idx, backend=self.backend)
    assert_close(y, y_ref, 1e-5, "y after the hand-off")
    assert_close(got.ssm, ref.ssm, 1e-5, "ssm after the hand-off")

  @pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={0}))
  def test_ragged_prefill_rejects_on_the_device(self, mode):
    """Inside jit (device-side checks only), R = 72 (the padded body, 64 rows, ends before
    R): a sequence with num_rows > R and one with a bad state_row are rejected (every y row
    NaN, entry, window and pending count untouched, no pre-pass fold), padding gives zeros,
    and the valid sequence matches the reference."""
    cfg = small_cfg(mode=mode, headdim=16)
    p = m.random_params(cfg, 12)
    rng = np.random.default_rng(12)
    B, R, E = 4, 72, 5
    state = random_state(cfg, E, rng=rng)
    idx = np.array([0, 1, 2, -1], np.int32)
    if cfg.compact:
      xw, dw = inputs(cfg, B, 8, rng=rng)
      _, state = m.verify(cfg, p, state, xw, dw, [0] * B, cache_indices=idx, backend="reference")
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    before = copy_state(state)
    ref = type(state)(*map(jnp.asarray, copy_state(state)))
    y_ref, _ = m.prefill(cfg, p, ref, xbc, dt, [3, 0, 0, 0], z=z, num_rows=[60, 72, 72, 72],
                         cache_indices=[0, -1, -1, -1], backend="reference")
    run = jax.jit(lambda s, r, n: m.prefill(cfg, p, s, xbc, dt, r, z=z, cache_indices=idx,
                                            num_rows=n, backend=self.backend))
    y, got = run(state, jnp.asarray([3, 0, 8, 0], jnp.int32), jnp.asarray([60, 73, 72, 72],
                                                                        jnp.int32))
    y = np.asarray(y, np.float32)
    assert_close(y[0], y_ref[0], 1e-5, "valid sequence")
    assert np.all(np.isnan(y[1])) and np.all(np.isnan(y[2])), "rejected: every row NaN"
    assert not np.any(y[3]), "padding: zeros"
    for name, a, b in zip(type(got)._fields, got, before):
      assert_bitwise(np.asarray(a)[1:3], b[1:3], f"{name} of the rejected entries")

  def test_ragged_prefill_errors_leave_the_state(self):
    cfg = small_cfg(headdim=16)
    p = m.random_params(cfg, 1)
    state = m.init_state(cfg, 2, jnp.float32)
    xbc, dt = inputs(cfg, 2, 40)
    with pytest.raises(ValueError, match=r"num_rows\[1\]=0: expected 1 <= num_rows <= R=40"):
      m.prefill(cfg, p, state, xbc, dt, [0, 0], num_rows=[40, 0], backend=self.backend)
    with pytest.raises(ValueError, match="runs on the chunked path, which chunked=False"):
      m.prefill(cfg, p, state, xbc, dt, [0, 0], num_rows=[40, 9], backend=self.backend,
                chunked=False)
    with pytest.raises(ValueError, match="on the reference backend needs host values"):
      m.prefill(cfg, p, state, xbc, dt, [0, 0], num_rows=jnp.asarray([40, 9], jnp.int32),
                backend="reference")
    assert not any(leaf.is_deleted() for leaf in state)
    assert_bitwise(state.ssm, jnp.zeros_like(state.ssm), "state kept")


@pytest.mark.gpu
class TestPrefillCompiled(PrefillChecks):
  backend = "pallas"


class TestPrefillInterpret(PrefillChecks):
  backend = "interpret"


@pytest.mark.parametrize("backend", ["interpret", pytest.param("pallas", marks=pytest.mark.gpu)])
def test_body_rows_fold_each_body_segment_in_one_product(backend):
  """`TileConfig.body_rows`: a call longer than the capacity on the verify kernels folds its
  body in segments of that many rows, one product each. It starts from the state an R=8
  verify call left (compact folds that call's accepted rows first); modes bitwise equal (y
  and committed states at three accepted rows), gated and not, full and partial segments
  (R=37 and 45 at capacity 8: bodies of 29 and 37 rows); within float32 rounding of row by
  row and of the reference; then R=8 verify calls continue from it. Bad values raise."""
  kern = jax.jit(dispatch.kernel_call, static_argnums=(0, 1, 5))
  snap = small_cfg(capacity=8)
  comp = snap.replace(replay_mode="compact")
  p = m.random_params(snap, 5)
  rng = np.random.default_rng(5)
  B = 3
  base = m.tile_config(snap, B)
  xbc, dt = inputs(snap, B, 8, jnp.float32, rng=rng)
  first = status.call_args(xbc, dt, np.zeros(B, np.int32))
  start = {c.replay_mode: kern(c, backend, p, m.init_state(c, B, jnp.float32), first, base)[1]
           for c in (snap, comp)}
  for R, body_rows, gated in ((37, 8, False), (45, 16, True), (37, 32, False)):
    tiles = dataclasses.replace(base, body_rows=body_rows)
    xbc, dt = inputs(snap, B, R, jnp.float32, rng=rng)
    z = jnp.asarray(rng.normal(size=(B, R, snap.d_inner)), jnp.float32) if gated else None
    args = status.call_args(xbc, dt, np.array([3, 7, 0], np.int32), z)
    out = {c.replay_mode: kern(c, backend, p, start[c.replay_mode], args, tiles)
           for c in (snap, comp)}
    what = f"R={R} body_rows={body_rows}"
    assert_bitwise(out["snapshot"][0], out["compact"][0], f"y, {what}")
    rows = np.array([7, 0, 4], np.int32)
    committed = [m.committed_state(c, p, out[c.replay_mode][1], rows, backend=backend)
                 for c in (snap, comp)]
    assert_bitwise(committed[0][0], committed[1][0], f"committed ssm, {what}")
    y_rows, st_rows = kern(snap, backend, p, start["snapshot"], args,
                           dataclasses.replace(base, body_rows=0))
    y_ref, st_ref = reference.snapshot_call(snap, p, start["snapshot"], args)
    for y_want, st_want, of in ((y_rows, st_rows, "row by row"), (y_ref, st_ref, "reference")):
      assert_close(out["snapshot"][0], y_want, 1e-5, f"y against {of}, {what}")
      assert_close(out["snapshot"][1].ssm, st_want.ssm, 1e-5, f"ssm against {of}, {what}")
    assert not np.array_equal(np.asarray(out["snapshot"][1].ssm), np.asarray(st_rows.ssm)), (
        f"{what}: the product gave the row-by-row bits; it did not run")
    states = {c.replay_mode: out[c.replay_mode][1] for c in (snap, comp)}
    xbc, dt = inputs(snap, B, 8, jnp.float32, rng=rng)
    args = status.call_args(xbc, dt, rows)
    ys = [kern(c, backend, p, states[c.replay_mode], args, tiles)[0] for c in (snap, comp)]
    assert_bitwise(ys[0], ys[1], f"y of the verify call after {what}")
  for bad in (4, 12):
    with pytest.raises(ValueError, match="body_rows: expected 0 or a power of two >= 8"):
      dataclasses.replace(base, body_rows=bad)


@pytest.mark.parametrize("capacity,body_rows,R,gated", [(5, 0, 17, True), (12, 32, 60, False),
                                                        (8, 32, 20, True), (5, 32, 45, True),
                                                        (8, 8, 25, False), (8, 8, 31, True),
                                                        (8, 32, 90, False), (8, 32, 40, False),
                                                        (8, 32, 41, True)])
def test_serial_body_segments_and_y_tiles(capacity, body_rows, R, gated):
  """Long calls on the verify kernels at segment layouts the Bolt tests do not reach: a
  capacity below its tile rows (KT=8 > 5: the kept rows' y stored row by row), row-by-row
  bodies (`body_rows=0`), bodies that end in a partial segment (capacity 12, R=60: 32 + 16
  rows; capacity 5, R=45: 32 + 8; 8-row segments with 1 and 7 rows over: R=25 and 31), run
  as a whole segment ending at the body's end with its first rows left out, and a short
  body in one 16-row product (R=20), a body of three conv tiles (R=90: 82 rows, the conv
  launch's tile loop), the longest body the conv launch loads at once and the shortest it
  loads in its loop (R=40 and 41: 32 and 33 rows); `num_rows` ending in the kept rows and
  inside the body (rows 20 and 36: before and within such a last segment's own rows);
  against the reference within float32 rounding, modes bitwise, rows past `num_rows` zero."""
  kern = jax.jit(dispatch.kernel_call, static_argnums=(0, 1, 5))
  snap = small_cfg(capacity=capacity)
  comp = snap.replace(replay_mode="compact")
  p = m.random_params(snap, 7)
  rng = np.random.default_rng(7)
  num_rows = np.array([R, R - 3, min(20, R - 1), min(36, R - 2)])
  B = len(num_rows)
  tiles = dataclasses.replace(m.tile_config(snap, B), body_rows=body_rows)
  xbc, dt = inputs(snap, B, R, jnp.float32, rng=rng)
  z = jnp.asarray(rng.normal(size=(B, R, snap.d_inner)), jnp.float32) if gated else None
  args = status.call_args(xbc, dt, np.zeros(B, np.int32), z, num_rows=num_rows)
  out = {c.replay_mode: kern(c, "interpret", p, m.init_state(c, B, jnp.float32), args, tiles)
         for c in (snap, comp)}
  what = f"capacity={capacity} body_rows={body_rows} R={R}"
  assert_bitwise(out["snapshot"][0], out["compact"][0], f"y, {what}")
  y_ref, st_ref = reference.snapshot_call(snap, p, m.init_state(snap, B, jnp.float32), args)
  assert_close(out["snapshot"][0], y_ref, 1e-5, f"y against the reference, {what}")
  assert_close(out["snapshot"][1].ssm, st_ref.ssm, 1e-5, f"ssm against the reference, {what}")
  for i, n in enumerate(num_rows):
    assert not np.any(np.asarray(out["snapshot"][0])[i, n:]), f"rows past num_rows, {what}"
  # The sequences that reach the kept rows (a call ending in its body hands off nothing).
  committed = [m.committed_state(c, p, out[c.replay_mode][1], [capacity - 1, capacity - 4, 0, 0],
                                 backend="interpret")[0][:2] for c in (snap, comp)]
  assert_bitwise(committed[0], committed[1], f"committed ssm, {what}")

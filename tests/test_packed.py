"""Packed prefill (`cu_seqlens`) against one-by-one prefills, the float64 oracle and both modes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import dispatch
from m2v_jax.kernels import chunk_scan as pk
from tests.helpers import (dev, assert_bitwise, assert_close, copy_state, inputs, matrix,
                           np_rows, random_state, small_cfg)

TILES = m.ChunkTiles(chunk=16)
# 1, capacity - 1, capacity, capacity + 1, a body of chunk - 1 / chunk / chunk + 1 rows,
# three chunks and a tail.
LENGTHS = [1, 7, 8, 9, 23, 24, 25, 61]


def packed_inputs(cfg, lengths, trailing, rng, dtype=jnp.float32):
  cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
  T = int(cu[-1]) + trailing
  xbc = dev(rng.normal(size=(T, cfg.conv_dim)), dtype)
  dt = dev(rng.normal(-0.5, 1.5, size=(T, cfg.nheads)), dtype)
  return cu, xbc, dt


def fresh_and_restored(cfg, E, rng, fresh):
  """A pool of random committed states with `fresh` entries reset to zero."""
  state = random_state(cfg, E, rng=rng)
  return m.reset_entries(state, np.asarray(fresh, np.int32))


def clone(state):
  return type(state)(*map(jnp.asarray, copy_state(state)))


class PackedChecks:
  """Packed prefill on one backend (compiled and interpret variants below)."""

  backend: str

  @pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
  def test_packed_matches_one_by_one_and_oracle(self, mode):
    """Every length class, fresh and restored entries in a permuted pool, three rows past
    the prompts: y and each entry against the prompt's own prefill on this backend (each
    prompt alone; the padded `prefill` against one-by-one calls is test_prefill's) and
    against the float64 recurrence; the rows past the prompts are zero."""
    cfg = small_cfg(mode=mode, headdim=16)
    p = m.random_params(cfg, 5)
    rng = np.random.default_rng(5)
    S, E = len(LENGTHS), len(LENGTHS) + 2
    idx = rng.permutation(E)[:S].astype(np.int32)
    state = fresh_and_restored(cfg, E, rng, idx[::2])
    cu, xbc, dt = packed_inputs(cfg, LENGTHS, 3, rng)
    sep = clone(state)
    ssm0 = np.asarray(state.ssm if mode == "compact" else state.ssm[:, 0])
    conv0 = np.asarray(state.conv if mode == "compact" else state.conv[:, 0])
    y, got = m.prefill_packed(cfg, p, state, xbc, dt, cu, cache_indices=idx,
                              backend=self.backend, chunk_tiles=TILES)
    assert y.shape == (xbc.shape[0], cfg.d_inner)
    assert_bitwise(y[cu[-1]:], jnp.zeros_like(y[cu[-1]:]), "rows past the prompts")
    Tmax = max(LENGTHS)                    # each prompt alone, in buffers of one shape
    for s, n in enumerate(LENGTHS):
      rows = slice(cu[s], cu[s + 1])
      pad = lambda a: jnp.pad(a[rows], [(0, Tmax - n), (0, 0)])
      y1, sep = m.prefill_packed(cfg, p, sep, pad(xbc), pad(dt), [0, n], cache_indices=[idx[s]],
                                 backend=self.backend, chunk_tiles=TILES)
      assert_close(y[rows], y1[:n], 1e-6, f"y of prompt {s} (n={n}) against its own prefill")
      want_y, want_st, _ = np_rows(cfg, p, ssm0[idx[s]][None], conv0[idx[s]][None],
                                   xbc[None, rows], dt[None, rows])
      assert_close(y[rows], want_y[0], 1e-5, f"y of prompt {s} (n={n}) against float64")
      last = min(n, cfg.capacity) - 1
      mine = m.committed_state(cfg, p, got, [last], cache_indices=[idx[s]],
                               backend=self.backend)
      theirs = m.committed_state(cfg, p, sep, [last], cache_indices=[idx[s]],
                                 backend=self.backend)
      assert_close(mine[0][0], theirs[0][0], 1e-6, f"state of prompt {s} (n={n})")
      assert_bitwise(mine[1][0], theirs[1][0], f"conv state of prompt {s} (n={n})")
      assert_close(mine[0][0], want_st[0, -1], 1e-5, f"state of prompt {s} against float64")
    for e in sorted(set(range(E)) - set(idx.tolist())):       # entries not addressed
      for name, a, b in zip(type(got)._fields, got, sep):
        assert_bitwise(a[e], b[e], f"untouched entry {e}: {name}")

  def test_packed_hands_off_bitwise_across_modes(self):
    """Packed prefill with a gate, then two verify calls from mixed accepted rows: y and the
    committed states bitwise equal between snapshot and compact after every call."""
    snap = small_cfg(headdim=16)
    comp = snap.replace(replay_mode="compact")
    p = m.random_params(snap, 6)
    rng = np.random.default_rng(6)
    lengths = [30, 5, 17]
    S = len(lengths)
    cu, xbc, dt = packed_inputs(snap, lengths, 0, rng)
    z = dev(rng.normal(size=(xbc.shape[0], snap.d_inner)), jnp.float32)
    s, c = m.init_state(snap, S, jnp.float32), m.init_state(comp, S, jnp.float32)
    ys, s = m.prefill_packed(snap, p, s, xbc, dt, cu, z=z, backend=self.backend,
                             chunk_tiles=TILES)
    yc, c = m.prefill_packed(comp, p, c, xbc, dt, cu, z=z, backend=self.backend,
                             chunk_tiles=TILES)
    assert_bitwise(ys, yc, "y of the packed prefill")
    rows = np.array([7, 4, 7], np.int32)
    for step in range(2):
      a = m.committed_state(snap, p, s, rows, backend=self.backend)
      b = m.committed_state(comp, p, c, rows, backend=self.backend)
      assert_bitwise(a[0], b[0], f"committed ssm before verify {step}")
      assert_bitwise(a[1], b[1], f"committed conv before verify {step}")
      xv = dev(rng.normal(size=(S, 8, snap.conv_dim)), jnp.float32)
      dv = dev(rng.normal(size=(S, 8, snap.nheads)), jnp.float32)
      ys, s = m.verify(snap, p, s, xv, dv, rows, backend=self.backend)
      yc, c = m.verify(comp, p, c, xv, dv, rows, backend=self.backend)
      assert_bitwise(ys, yc, f"y of verify {step}")
      rows = np.array([2, 7, 0], np.int32)

  @pytest.mark.parametrize("mode,tiles", matrix(
      [("snapshot", TILES), ("compact", TILES),
       ("snapshot", m.ChunkTiles(chunk=16, fused_pass=1, fused_y=1))], keep={0, 2}))
  def test_packed_rejects_on_the_device(self, mode, tiles):
    """Under jit with device offsets: a padding entry gives zeros, a bad state_row and an
    empty prompt are rejected (NaN y, entry untouched), the others match the reference;
    with the three kernels or the whole scan in one (`fused_y`, whose programs fill the
    rejected prompt's body rows and whose fill kernel the rest)."""
    cfg = small_cfg(mode=mode, headdim=16)
    p = m.random_params(cfg, 7)
    rng = np.random.default_rng(7)
    lengths = [20, 11, 12, 0, 9]
    E = 6
    cu, xbc, dt = packed_inputs(cfg, lengths, 2, rng)
    idx = np.array([0, -1, 2, 3, 4], np.int32)
    # 9: outside snapshot's slots, and not 0 with nothing pending in compact mode.
    rows = np.array([0, 0, 9, 0, 1 if mode == "snapshot" else 0], np.int32)
    state = random_state(cfg, E, rng=rng)
    before = copy_state(state)
    step = jax.jit(lambda st, x, d, cu, r, i: m.prefill_packed(
        cfg, p, st, x, d, cu, state_row=r, cache_indices=i, backend=self.backend,
        chunk_tiles=tiles))
    y, got = step(state, xbc, dt, jnp.asarray(cu), jnp.asarray(rows), jnp.asarray(idx))
    y = np.asarray(y)
    assert np.all(y[cu[1]:cu[2]] == 0.0), "padding entry"
    assert np.all(np.isnan(y[cu[2]:cu[3]])), "bad state_row: NaN y"
    assert np.all(y[cu[5]:] == 0.0), "rows past the prompts"
    for e in (2, 3, 5):                             # rejected, the empty prompt's, unused
      for name, a, b in zip(type(got)._fields, got, before):
        assert_bitwise(a[e], b[e], f"entry {e}: {name}")
    ref = type(state)(*map(jnp.asarray, before))
    ok = [0, 4]
    sub = np.concatenate([[0], np.cumsum([lengths[s] for s in ok])]).astype(np.int32)
    take = np.concatenate([np.arange(cu[s], cu[s + 1]) for s in ok])
    y_ref, want = m.prefill_packed(cfg, p, ref, xbc[take], dt[take], sub,
                                   state_row=rows[ok], cache_indices=idx[ok],
                                   backend="reference")
    assert_close(y[take], y_ref, 1e-5, "y of the prompts run")
    for e in (0, 4):
      assert_close(got.ssm[e], want.ssm[e], 1e-5, f"ssm of entry {e}")


  @staticmethod
  def segmented(cfg, backend, state, T, S, act, tiles, n):
    """`tiles` with `scratch_mb` just what n segments take (`ChunkPlan.scratch_at`), for S
    sequences in T rows of `act`; asserts that the call then runs in n segments."""
    plan = dispatch.chunk_plan(cfg, backend, state, T, S, act, True, T - cfg.capacity, tiles)
    assert len(plan.segments) == 1
    cut = dataclasses.replace(plan, tiles=dataclasses.replace(
        tiles, scratch_mb=(plan.scratch_at(n) + S) / (S * 1e6)))          # MB a sequence
    assert len(cut.segments) == n
    assert pk.scratch_bytes(cut) <= cut.scratch_budget < pk.scratch_bytes(plan)
    return cut.tiles

  @staticmethod
  def as_one_scan(run, state, one_scan, tiles):
    """`run(state, tiles)` against `run` of a copy with `one_scan`, bitwise (y, every leaf of
    the pool); returns the pool."""
    y1, one = run(clone(state), one_scan)
    y, got = run(state, tiles)
    assert_bitwise(y, y1, "y")
    for name, a, b in zip(type(got)._fields, got, one):
      assert_bitwise(a, b, name)
    return got

  @pytest.mark.parametrize("mode,fused,n,act,acum", matrix([
      ("snapshot", 1, 10, jnp.float32, 0), ("compact", 0, 3, jnp.bfloat16, 1),
      ("compact", 1, 5, jnp.float32, 1), ("snapshot", 0, 2, jnp.bfloat16, 0),
      ("snapshot", 2, 4, jnp.bfloat16, 0), ("compact", 2, 3, jnp.float32, 0)],
      keep={0, 1, 2, 4, 5}))
  def test_segments_equal_one_scan(self, mode, fused, n, act, acum):
    """Body slots scanned in n segments against one scan, bitwise: y and every
    entry of a bfloat16 pool (the states carried between segments stay float32), bodies
    crossing segments, a gate, a padding entry and a rejected prompt, with either pass
    kernel or the whole scan in one (`fused` 2: `fused_y`, its fill kernel in the last
    segment), float32 or bfloat16 activations, the output kernel's decay summed in it or
    loaded (`out_acum`: computed per segment)."""
    cfg = small_cfg(mode=mode, headdim=16)
    p = m.random_params(cfg, 8)
    rng = np.random.default_rng(8)
    lengths = [45, 5, 12, 61, 20]
    S, E = len(lengths), 6
    cu, xbc, dt = packed_inputs(cfg, lengths, 2, rng, act)
    z = dev(rng.normal(size=(xbc.shape[0], cfg.d_inner)), act)
    idx = np.array([0, -1, 2, 3, 4], np.int32)
    rows = np.array([1, 0, 9, 0, 0], np.int32)   # 9: prompt 2 rejected on the device
    state = random_state(cfg, E, act, rng=rng)
    state = state._replace(ssm=state.ssm.astype(jnp.bfloat16))
    one_scan = m.ChunkTiles(chunk=16, fused_pass=min(fused, 1), fused_y=int(fused == 2),
                            scratch_mb=0, out_acum=acum)
    tiles = self.segmented(cfg, self.backend, state, xbc.shape[0], S, act, one_scan, n)
    before = copy_state(state)
    run = lambda st, t: m.prefill_packed(cfg, p, st, xbc, dt, jnp.asarray(cu), z=z,
                                         state_row=jnp.asarray(rows),
                                         cache_indices=jnp.asarray(idx),
                                         backend=self.backend, chunk_tiles=t)
    got = self.as_one_scan(run, state, one_scan, tiles)
    for e in (2, 5):                                 # rejected, unused
      for name, a, b in zip(type(got)._fields, got, before):
        assert_bitwise(a[e], b[e], f"entry {e}: {name}")

  def test_a_full_segment_equals_one_scan(self):
    """Two prompts of capacity + 2L + 1 rows (three chunks each, cut 1 + 2) in two
    segments: the second holds `segment_slots` body slots, as many as the bound allows;
    bitwise one scan's."""
    cfg = small_cfg(mode="compact", headdim=16)
    L = 16
    p = m.random_params(cfg, 12)
    rng = np.random.default_rng(12)
    lengths = [cfg.capacity + 2 * L + 1] * 2
    cu, xbc, dt = packed_inputs(cfg, lengths, 0, rng)
    state = random_state(cfg, 2, rng=rng)
    one_scan = m.ChunkTiles(chunk=L, scratch_mb=0)
    tiles = self.segmented(cfg, self.backend, state, xbc.shape[0], 2, jnp.float32, one_scan, 2)
    plan = dispatch.chunk_plan(cfg, self.backend, state, xbc.shape[0], 2, jnp.float32, False,
                               xbc.shape[0] - cfg.capacity, tiles)
    base, n, span, trailing = dispatch.packed_layout(jnp.asarray(cu), xbc.shape[0])
    _, t = dispatch.packed_slots(plan, base, n, span, trailing)
    assert np.asarray(t.count).tolist() == [[1, 1, 0], [2, 2, 0]] and plan.segment_slots == 4
    run = lambda st, t: m.prefill_packed(cfg, p, st, xbc, dt, jnp.asarray(cu),
                                         state_row=[0, 0], cache_indices=[0, 1],
                                         backend=self.backend, chunk_tiles=t)
    self.as_one_scan(run, state, one_scan, tiles)

  @pytest.mark.parametrize("mode", matrix(["compact", "snapshot"], keep={0}))
  def test_segments_of_a_ragged_prefill_equal_one_scan(self, mode):
    """The padded `prefill` with `num_rows` (ragged) in four segments against one scan,
    bitwise: y and the pool."""
    cfg = small_cfg(mode=mode, headdim=16)
    p = m.random_params(cfg, 10)
    rng = np.random.default_rng(10)
    B, R = 3, 57
    xbc, dt, z = inputs(cfg, B, R, rng=rng, z=True)
    n = jnp.asarray([54, 19, 40], jnp.int32)
    state = random_state(cfg, B, rng=rng)
    one_scan = m.ChunkTiles(chunk=16, scratch_mb=0)
    tiles = self.segmented(cfg, self.backend, state, B * R, B, jnp.float32, one_scan, 4)
    run = lambda st, t: m.prefill(cfg, p, st, xbc, dt, [0] * B, z=z, num_rows=n,
                                  backend=self.backend, chunked=True, chunk_tiles=t)
    self.as_one_scan(run, state, one_scan, tiles)


class TestPackedInterpret(PackedChecks):
  backend = "interpret"


@pytest.mark.gpu
class TestPackedCompiled(PackedChecks):
  backend = "pallas"


@pytest.mark.parametrize("cu,match", [
    ([1, 5, 9], r"cu_seqlens\[0\]=1: expected 0"),
    ([0, 5, 5, 9], "prompt 1 has 0 rows"),
    ([0, 5, 40], "end past xbc's T=20 rows"),
    ([0, 5, 20], r"shared|all address pool entry 1")])
def test_packed_host_errors_leave_the_state(cu, match):
  """Offsets and entries checked on the host: a clear error, the pool neither donated nor
  changed."""
  cfg = small_cfg(headdim=16)
  p = m.random_params(cfg, 8)
  rng = np.random.default_rng(8)
  state = random_state(cfg, 4, rng=rng)
  before = copy_state(state)
  _, xbc, dt = packed_inputs(cfg, [20], 0, rng)
  ci = [1, 1] if len(cu) == 3 and cu[-1] == 20 else None
  if ci is None:
    ci = list(range(len(cu) - 1))
  with pytest.raises(ValueError, match=match):
    m.prefill_packed(cfg, p, state, xbc, dt, cu, cache_indices=ci, backend="interpret")
  for name, a, b in zip(type(state)._fields, state, before):
    assert_bitwise(a, b, name)


def test_packed_names_an_unsupported_geometry():
  """Compiled, a headdim without a power-of-two divisor >= 16 cannot take the chunked path:
  the check `prefill_packed` runs names it and the way out (interpret mode takes it)."""
  from m2v_jax import dispatch
  cfg = small_cfg(headdim=8)
  with pytest.raises(ValueError, match="prefill_packed runs on the chunked path: .*headdim"):
    dispatch.check_packed(cfg, "pallas")
  dispatch.check_packed(cfg, "interpret")
  dispatch.check_packed(small_cfg(headdim=16), "pallas")


def test_packed_reference_needs_host_offsets():
  cfg = small_cfg(headdim=16)
  p = m.random_params(cfg, 8)
  state = m.init_state(cfg, 1, jnp.float32)
  x, d = jnp.zeros((12, cfg.conv_dim)), jnp.zeros((12, cfg.nheads))
  with pytest.raises(ValueError, match="reference backend .* needs host values"):
    m.prefill_packed(cfg, p, state, x, d, jnp.asarray([0, 12], jnp.int32), backend="reference")


def test_packed_mixer_and_sharding():
  """`layer.mixer` with `cu_seqlens` equals each prompt's own mixer prefill; `sharding.sharded`
  of `prefill_packed` with heads over 2 devices, each scanning its heads in three segments,
  equals one device's one scan bitwise (y and state)."""
  ssm = small_cfg(headdim=16)
  cfg = m.MixerConfig(ssm=ssm, d_model=32)
  p = m.layer.random_mixer_params(cfg, 4)
  rng = np.random.default_rng(4)
  lengths = [21, 3]
  cu = np.array([0, 21, 24], np.int32)
  hidden = dev(rng.normal(size=(24, cfg.d_model)), jnp.float32)
  out, packed = m.mixer(cfg, p, m.init_state(ssm, 2, jnp.float32), hidden, 0, cu_seqlens=cu,
                        backend="interpret")
  sep = m.init_state(ssm, 2, jnp.float32)
  for s, n in enumerate(lengths):
    one = [-1, -1]
    one[s] = s
    h = jnp.broadcast_to(hidden[cu[s]:cu[s + 1]], (2, n, cfg.d_model))
    o, sep = m.mixer(cfg, p, sep, h, [0, 0], cache_indices=one, prefill=True,
                     chunked=True if n > ssm.capacity else None, backend="interpret")
    assert_close(out[cu[s]:cu[s + 1]], o[s], 1e-6, f"mixer out of prompt {s}")
  assert_close(packed.ssm, sep.ssm, 1e-6, "ssm")
  with pytest.raises(ValueError, match="no num_rows"):
    m.mixer(cfg, p, m.init_state(ssm, 2, jnp.float32), hidden, 0, cu_seqlens=cu,
            num_rows=[21, 3], backend="interpret")

  devices = jax.devices("cpu")
  if len(devices) < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
  mesh = jax.sharding.Mesh(np.array(devices[:2]), ("tp",))
  params = m.random_params(ssm, 4)
  cu, xbc, dt = packed_inputs(ssm, [30, 9, 1], 2, rng)
  state = random_state(ssm, 3, rng=rng)
  ptp, stp, xtp = m.sharding.to_tp_layout(ssm, 2, params=params, state=clone(state), xbc=xbc)
  ptp, stp = m.sharding.put(mesh, head_axis="tp", params=ptp, state=stp)
  local = dispatch.chunk_plan(ssm.replace(nheads=ssm.nheads // 2), "interpret", state,
                             xbc.shape[0], 3, xbc.dtype, False, xbc.shape[0], TILES)
  cut = dataclasses.replace(TILES, scratch_mb=(local.scratch_at(3) + 3) / 3e6)
  assert dataclasses.replace(local, tiles=cut).segment_count == 3     # each device's heads
  step = jax.jit(m.sharding.sharded(m.prefill_packed, mesh, ssm, head_axis="tp",
                                    backend="interpret", chunk_tiles=cut), donate_argnums=1)
  y2, stp = step(ptp, stp, xtp, dt, jnp.asarray(cu), jnp.zeros(3, jnp.int32))
  y1, one = m.prefill_packed(ssm, params, state, xbc, dt, cu, backend="interpret",
                             chunk_tiles=TILES)
  assert_bitwise(y1, y2, "y")
  _, back, _ = m.sharding.from_tp_layout(ssm, 2, state=stp)
  for name, a, b in zip(type(one)._fields, one, back):
    assert_bitwise(a, b, name)
  with pytest.raises(ValueError, match="batch_axis"):
    m.sharding.sharded(m.prefill_packed, mesh, ssm, head_axis="tp", batch_axis="tp")


@pytest.mark.parametrize("cu,T", [
    ([0, 30, 31, 40, 52], 60),      # a prompt of one row, rows past the prompts
    ([0, 10, 5, 30], 30),           # offsets out of order
    ([0, 5, 40], 20),               # past T
    ([3, 10, 20], 20),              # not starting at 0
    ([0, 9, 9, 25], 25)])           # an empty prompt
def test_device_offsets_cover_every_row_once(cu, T):
  """Whatever the device offsets, the slots (bodies, filled blocks) and the verify tails write
  each of the T rows of y exactly once: no row is left unwritten (garbage on a GPU), none
  written twice (a race)."""
  from m2v_jax import dispatch
  from m2v_jax.kernels import chunk_scan as pk
  cfg = small_cfg(headdim=16)
  cap = cfg.capacity
  S = len(cu) - 1
  plan = pk.ChunkPlan(cfg=cfg, T=T, S=S, E=S, has_z=False, y_dtype=jnp.float32, tiles=TILES,
                      interpret=True)
  base, n, span, trailing = dispatch.packed_layout(jnp.asarray(cu, jnp.int32), T)
  rb, t = dispatch.packed_slots(plan, base, n, span, trailing)
  base, n, rb = map(np.asarray, (base, n, rb))
  count = np.zeros(T, int)
  for r0, k in zip(np.asarray(t.row0), np.asarray(t.rows)):
    count[r0:r0 + k] += 1
  for b, r, k in zip(base, rb, np.minimum(n, cap)):
    count[b + r:b + r + k] += 1
  assert count.tolist() == [1] * T, count


@pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
def test_a_nan_in_one_prompt_stays_there(mode):
  """Non-finite input in prompt 1's first rows leaves prompt 0 (whose last body chunk is
  partial, so its tile reaches into prompt 1's rows) bitwise as without it, and prompt 1's
  entry gets the non-finite state it asked for."""
  cfg = small_cfg(mode=mode, headdim=16)
  p = m.random_params(cfg, 9)
  rng = np.random.default_rng(9)
  cu, xbc, dt = packed_inputs(cfg, [30, 20], 0, rng)
  run = lambda x: m.prefill_packed(cfg, p, m.init_state(cfg, 2, jnp.float32), x, dt, cu,
                                   backend="interpret", chunk_tiles=TILES)
  y0, s0 = run(xbc)
  y1, s1 = run(xbc.at[31].set(jnp.inf).at[32].set(jnp.nan))
  assert_bitwise(y1[:30], y0[:30], "y of prompt 0")
  for name, a, b in zip(type(s0)._fields, s0, s1):
    assert_bitwise(a[0], b[0], f"{name} of prompt 0")
  assert not np.all(np.isfinite(np.asarray(y1[30:])))


def test_slot_counts_hold_for_random_layouts():
  """For random prompt lengths (short ones and bodies of kL + 1 rows, T not a multiple of L)
  in 1, 2, 3 or 6 segments: every body chunk has exactly one slot, in the segment its part
  falls in, among that segment's first `segment_slots` (the chunk kernels' grid and
  scratch), each sequence's slots of a segment in order from its `first`, its parts never
  empty between two that are not; `opens`, `carry_in` and `carry_out` as the slots say; the
  fill blocks come last and all slots fit `n_slots`. The host builds the same tables."""
  cfg = small_cfg(headdim=16)
  rng = np.random.default_rng(0)
  S, T, L = 10, 403, TILES.chunk                      # fixed shapes: compiled once per count
  one = pk.ChunkPlan(cfg=cfg, T=T, S=S, E=S, has_z=False, y_dtype=jnp.float32, tiles=TILES,
                     interpret=True)
  for k in range(32):
    nseg = (1, 2, 3, 6)[k % 4]
    plan = dataclasses.replace(one, tiles=dataclasses.replace(
        TILES, scratch_mb=(one.scratch_at(nseg) + S) / (S * 1e6)))
    assert plan.segment_count == nseg
    lengths = np.where(rng.random(S) < 0.5, rng.integers(1, 20, S),
                       cfg.capacity + L * rng.integers(1, 6, S) + 1)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    base, n, span, trailing = dispatch.packed_layout(cu, T)
    rb, t = dispatch.packed_slots(plan, base, n, span, trailing)
    rb_h, on_host = dispatch.packed_slots(plan, *(np.asarray(a) for a in (base, n, span)),
                                          int(trailing))
    assert isinstance(rb_h, np.ndarray) and isinstance(on_host.seq, np.ndarray)
    assert_bitwise(rb_h, rb, f"layout {k}: rb on the host")
    for name, a, b in zip(pk.Slots._fields, on_host, t):
      assert (a is None) == (b is None), name
      if a is not None:
        assert a.dtype == np.int32, name
        assert_bitwise(a, b, f"layout {k}: {name} on the host")
    seq, row0, rows, body = (np.asarray(a) for a in t[:4])
    first, count, opens, cin, cout = (np.asarray(a) for a in (
        t.first, t.count, t.opens, t.carry_in, t.carry_out))
    per, base, rb = plan.segment_slots, np.asarray(base), np.asarray(rb)
    for s in range(S):
      chunks = -(-rb[s] // L)
      at = [np.flatnonzero(body.astype(bool) & (seq == s) & (row0 == base[s] + c * L))
            for c in range(chunks)]
      assert all(len(a) == 1 for a in at), (k, s)
      at = np.concatenate(at) if chunks else np.zeros(0, int)
      seg_of = np.minimum(at // per, nseg - 1)
      assert np.all(at - seg_of * per < per), "within the segment's body slots"
      assert np.all(np.diff(seg_of) >= 0) and np.all(np.diff(seg_of) <= 1), "parts in order"
      for j in range(nseg):
        mine = at[seg_of == j] - j * per
        assert count[j, s] == len(mine)
        assert list(mine) == list(range(first[j, s], first[j, s] + count[j, s]))
        had, has, will = (seg_of < j).any(), len(mine) > 0, (seg_of > j).any()
        assert (opens[j, s], cin[j, s], cout[j, s]) == (has and not had, has and had,
                                                         has and will), (k, s, j)
    assert not count[:, S].any(), "the entry past the sequences has no body"
    assert np.all(np.flatnonzero(body) < plan.body_slots) and len(seq) == plan.n_slots
    fills = np.flatnonzero((body == 0) & (rows > 0))
    assert np.all(fills >= (nseg - 1) * per)
    assert rows.sum() == T - int(np.minimum(np.asarray(n), cfg.capacity).sum())

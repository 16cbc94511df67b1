"""State pools (cache_indices, padding, reuse), per-sequence num_rows, NaN isolation, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import m2v_jax as m
from m2v_jax import checks
from tests.helpers import (assert_bitwise, assert_close, assert_states_close, copy_state, inputs,
                           small_cfg)

E, B = 16, 5


class PoolPair:
  """The same pool calls in both modes and on the reference, checked after every call."""

  def __init__(self, backend, seed, cfg=None, num_entries=E, batch=B, dtype=jnp.float32):
    self.snap = cfg or small_cfg()
    self.comp = self.snap.replace(replay_mode="compact")
    self.p = m.random_params(self.snap, seed)
    self.backend, self.E, self.B, self.dtype = backend, num_entries, batch, dtype
    self.rng = np.random.default_rng(seed)
    self.k = {c.replay_mode: m.init_state(c, num_entries, dtype) for c in (self.snap, self.comp)}
    self.r = {c.replay_mode: m.init_state(c, num_entries, dtype) for c in (self.snap, self.comp)}

  def call(self, idx, rows, nrows, R=8, nan_seq=None):
    E, B = self.E, self.B
    idx, rows, nrows = (np.asarray(a, np.int32) for a in (idx, rows, nrows))
    xbc, dt = inputs(self.snap, B, R, self.dtype, rng=self.rng)
    if nan_seq is not None:
      xbc = xbc.at[nan_seq, 0, :5].set(jnp.nan).at[nan_seq, 1, 7].set(jnp.inf)
    before = {k: copy_state(v) for k, v in self.k.items()}
    ys = {}
    for cfg in (self.snap, self.comp):
      mode = cfg.replay_mode
      ys[mode], self.k[mode] = m.verify(cfg, self.p, self.k[mode], xbc, dt, rows,
                                        cache_indices=idx, num_rows=nrows, backend=self.backend)
      yr, self.r[mode] = m.verify(cfg, self.p, self.r[mode], xbc, dt, rows, cache_indices=idx,
                                  num_rows=nrows, backend="reference")
      live = [b for b in range(B) if b != nan_seq]
      tol = 1e-5 if self.dtype == jnp.float32 else 2e-2
      assert_close(np.asarray(ys[mode], np.float32)[live], np.asarray(yr, np.float32)[live], tol,
                   f"{mode} y vs reference")
      clean = [e for e in range(E) if nan_seq is None or e != idx[nan_seq]]
      for name, a, b in zip(type(self.k[mode])._fields, self.k[mode], self.r[mode]):
        a, b = np.asarray(a)[clean], np.asarray(b)[clean]
        if name == "pending":
          assert_bitwise(a, b, "pending vs reference")
        else:
          assert_close(a, b, 1e-5, f"{mode} {name} vs reference")
      untouched = sorted(set(range(E)) - set(idx.tolist()))
      for name, a, b in zip(type(self.k[mode])._fields, self.k[mode], before[mode]):
        assert_bitwise(np.asarray(a)[untouched], b[untouched], f"{mode} {name}: unaddressed entries")
    assert_bitwise(ys["snapshot"], ys["compact"], "y snapshot vs compact")
    y = np.asarray(ys["snapshot"])
    for b in range(B):
      if idx[b] == -1:
        assert not np.any(y[b]), "padding rows are zeros"
      else:
        assert not np.any(y[b, nrows[b]:]), "rows past num_rows are zeros"
    return ys

  def committed(self, idx, rows):
    out = [m.committed_state(c, self.p, self.k[c.replay_mode], np.asarray(rows, np.int32),
                             cache_indices=np.asarray(idx, np.int32), backend=self.backend)
           for c in (self.snap, self.comp)]
    for a, b in zip(*out):
      assert_bitwise(a, b, "committed snapshot vs compact")
    return out[0]


def check_reused_entry(backend, cfg=None, num_entries=E, batch=B, dtype=jnp.float32, seed=2):
  """A pool entry reset for a new request carries nothing of the previous one over (window,
  pending rows, conv, state): after a reset, its y equals that of the same entry of a fresh
  pool, bitwise; both pool calls are checked against the reference on the way."""
  assert num_entries > batch, "entries 1..batch are used, and a fresh one for the reuse"
  pp = PoolPair(backend, seed=seed, cfg=cfg, num_entries=num_entries, batch=batch, dtype=dtype)
  idx = np.arange(1, batch + 1)
  reused = int(idx[3])
  pp.call(idx=idx, rows=np.zeros(batch), nrows=np.full(batch, 8))
  # entry `reused` now serves a new request: reset it in both modes (and the reference)
  for d in (pp.k, pp.r):
    for k in d:
      d[k] = m.reset_entries(d[k], [reused])
  idx2 = np.roll(idx, -3)                                 # reused first, one padding sequence
  idx2[2] = -1
  rows = pp.rng.integers(0, 8, batch)
  rows[0] = rows[2] = 0
  nrows = np.full(batch, 8)
  nrows[2] = 1
  pp.call(idx=idx2, rows=rows, nrows=nrows)
  # a fresh pool gives entry `reused` the same results: the reset left nothing behind
  others = [e for e in range(num_entries) if e != reused]
  later = np.array([reused] + (others[::2] + others[1::2])[:batch - 1], np.int32)
  args = inputs(pp.snap, batch, 8, dtype, rng=np.random.default_rng(5))
  fresh = m.init_state(pp.comp, num_entries, dtype)
  y, fresh = m.verify(pp.comp, pp.p, fresh, *args, [0] * batch, cache_indices=later,
                      backend=backend)
  for k in pp.k:
    pp.k[k] = m.reset_entries(pp.k[k], [reused])
  y2, pp.k["compact"] = m.verify(pp.comp, pp.p, pp.k["compact"], *args, [0] * batch,
                                 cache_indices=later, backend=backend)
  assert_bitwise(np.asarray(y)[0], np.asarray(y2)[0], "reused entry")


def check_nan_isolation(backend, cfg=None, num_entries=E, batch=B, dtype=jnp.float32, seed=4):
  """NaN and Inf inputs in one sequence (index 2) leave every other sequence's y and state
  bitwise equal to a run without them (pool entries shuffled)."""
  order = np.random.default_rng(seed).permutation(num_entries)[:batch]
  full = np.full(batch, 8)
  pair = lambda: PoolPair(backend, seed=seed, cfg=cfg, num_entries=num_entries, batch=batch,
                          dtype=dtype)
  pp, clean = pair(), pair()          # same seed: their input draws stay in step
  for q in (pp, clean):
    q.call(idx=order, rows=np.zeros(batch), nrows=full)
  rng = np.random.default_rng(seed + 1)
  rows, nrows = rng.integers(0, 8, batch), rng.integers(1, 9, batch)
  ys = pp.call(idx=order, rows=rows, nrows=nrows, nan_seq=2)
  ys_clean = clean.call(idx=order, rows=rows, nrows=nrows)
  others = [b for b in range(batch) if b != 2]
  for mode in ys:
    assert_bitwise(np.asarray(ys[mode])[others], np.asarray(ys_clean[mode])[others], f"{mode} y")
    for name, a, b in zip(type(pp.k[mode])._fields, pp.k[mode], clean.k[mode]):
      assert_bitwise(np.asarray(a)[order[others]], np.asarray(b)[order[others]], f"{mode} {name}")
    assert np.any(np.isnan(np.asarray(ys[mode], np.float32)[2])), "the NaN reached its own y"


def test_host_checks_for_pools():
  cfg = small_cfg()
  p = m.random_params(cfg, 5)
  st = m.init_state(cfg, E, jnp.float32)
  xbc, dt = inputs(cfg, 3, 4)
  with pytest.raises(ValueError, match=r"cache_indices\[1\]=16: expected -1 \(padding\) or 0 <= index < 16"):
    m.verify(cfg, p, st, xbc, dt, [0, 0, 0], cache_indices=[0, 16, 2])
  with pytest.raises(ValueError, match="an entry appears twice"):
    m.verify(cfg, p, st, xbc, dt, [0, 0, 0], cache_indices=[5, 2, 5])
  with pytest.raises(ValueError, match=r"num_rows\[2\]=5: expected 1 <= num_rows <= R=4"):
    m.verify(cfg, p, st, xbc, dt, [0, 0, 0], cache_indices=[0, 1, 2], num_rows=[1, 4, 5])


# (replay mode, window, state dtype) of the sharding tests: both modes, deferred commit and
# 16-bit state storage.
SHARDED_VARIANTS = [("snapshot", None, jnp.float32), ("compact", None, jnp.float32),
                    ("compact", 16, jnp.float32), ("snapshot", None, jnp.bfloat16),
                    ("compact", 16, jnp.bfloat16)]


@pytest.mark.parametrize("mode,window,state_dtype", SHARDED_VARIANTS)
def test_two_way_head_sharding_matches_one_device(mode, window, state_dtype):
  """A layer with heads over 2 devices (and sequences over 2) equals the one-device run,
  bitwise per head, over verify calls, and a chunked prefill (body + serial tail) in the
  first and last variant (the prefill path is the same in all)."""
  devices = jax.devices() if jax.device_count() >= 4 else jax.devices("cpu")
  if len(devices) < 4:
    pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
  backend = "pallas" if devices[0].platform == "gpu" else "interpret"
  cfg = m.Mamba2Config(nheads=4, headdim=16, dstate=16, ngroups=2, replay_mode=mode,
                       window=window)
  mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("dp", "tp"))
  with_prefill = (mode, window, state_dtype) in (SHARDED_VARIANTS[0], SHARDED_VARIANTS[-1])
  check_sharded_verify(cfg, mesh, backend, jnp.float32, Bsz=4, seed=6,
                       Rs=(8, 5, 40, 8) if with_prefill else (8, 5, 8),
                       state_dtype=state_dtype, chunked=True)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_sharding_with_a_make_mesh_mesh(mode):
  """`jax.make_mesh` gives Explicit axes (a `Mesh` built by hand: Auto ones); the sharded op
  takes both: heads over 2 devices equal the one-device run bitwise, and with the inputs
  placed by `sharding.put` the state is donated without a copy (no warning, which the test
  suite turns into an error)."""
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
  backend = "pallas" if jax.devices()[0].platform == "gpu" else "interpret"
  mesh = jax.make_mesh((2,), ("tp",))
  assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
  cfg = m.Mamba2Config(nheads=4, headdim=8, dstate=16, ngroups=2, replay_mode=mode)
  check_sharded_verify(cfg, mesh, backend, jnp.float32, Bsz=2, seed=8, Rs=(8, 3),
                       batch_axis=None)


def check_sharded_verify(cfg, mesh, backend, dtype, Bsz, seed, Rs, batch_axis="dp",
                         state_dtype=jnp.float32, chunked=None):
  """Runs calls of R in `Rs` rows (`verify` for R <= capacity, else `prefill` with `chunked`)
  with heads over mesh axis "tp" and sequences over "dp", and on one device; y and the
  states agree bitwise after every call."""
  p = m.random_params(cfg, seed)
  rng = np.random.default_rng(seed)
  n = mesh.shape["tp"]
  steps = {}
  for op, kw in ((m.verify, {}), (m.prefill, dict(chunked=chunked))):
    run = m.sharding.sharded(op, mesh, cfg, head_axis="tp", batch_axis=batch_axis,
                             backend=backend, **kw)
    steps[op] = (jax.jit(run, donate_argnums=1), kw)
  one = m.init_state(cfg, Bsz, dtype, state_dtype=state_dtype)
  ptp, many, _ = m.sharding.to_tp_layout(
      cfg, n, params=p, state=m.init_state(cfg, Bsz, dtype, state_dtype=state_dtype))
  ptp, many = m.sharding.put(mesh, head_axis="tp", batch_axis=batch_axis, params=ptp,
                             state=many)
  rows = np.zeros(Bsz, np.int32)
  for R in Rs:
    op = m.verify if R <= cfg.capacity else m.prefill
    step, kw = steps[op]
    xbc, dt = inputs(cfg, Bsz, R, dtype, rng=rng)
    y1, one = op(cfg, p, one, xbc, dt, rows, backend=backend, **kw)
    _, _, xtp = m.sharding.to_tp_layout(cfg, n, xbc=xbc)
    y2, many = step(ptp, many, xtp, dt, jnp.asarray(rows))
    assert len(y2.sharding.device_set) == mesh.size
    assert_bitwise(y1, y2, f"y (R={R})")
    _, back, _ = m.sharding.from_tp_layout(cfg, n, state=many)
    for name, a, b in zip(type(one)._fields, one, back):
      assert_bitwise(a, b, f"{name} (R={R})")
    rows = rng.integers(0, min(R, cfg.capacity), Bsz).astype(np.int32)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_sharded_mixer_matches_one_device(mode):
  """The mixer layer with heads over 2 devices (sequences over 2) against one device."""
  devices = jax.devices() if jax.device_count() >= 4 else jax.devices("cpu")
  if len(devices) < 4:
    pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
  backend = "pallas" if devices[0].platform == "gpu" else "interpret"
  ssm = m.Mamba2Config(nheads=4, headdim=16, dstate=16, ngroups=2, replay_mode=mode)
  mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("dp", "tp"))
  check_sharded_mixer(m.MixerConfig(ssm=ssm, d_model=48), mesh, backend, Bsz=4, seed=3,
                      Rs=(8, 40, 5))


def test_sharded_mixer_checks_the_norm_groups():
  ssm = m.Mamba2Config(nheads=4, headdim=16, dstate=16, ngroups=2)
  cfg = m.MixerConfig(ssm=ssm, d_model=48, norm_groups=1)
  mesh = Mesh(np.array(jax.devices("cpu")[:2]), ("tp",))
  with pytest.raises(ValueError, match="norm's groups=1, got 2"):
    m.sharding.sharded_mixer(mesh, cfg, head_axis="tp")


def check_sharded_mixer(cfg, mesh, backend, Bsz, seed, Rs, chunked=True):
  """Calls of the mixer layer (`prefill` for R > capacity) with heads over mesh axis "tp" and
  sequences over "dp", and on one device, float32 activations and weights: out and the
  states agree to float32 rounding (each shard runs its own columns of in_proj, and
  out_proj's sum is split across the shards), the integer leaves exactly."""
  p = m.layer.random_mixer_params(cfg, seed)
  rng = np.random.default_rng(seed)
  n = mesh.shape["tp"]
  runs = {pf: jax.jit(m.sharding.sharded_mixer(mesh, cfg, head_axis="tp", batch_axis="dp",
                                                prefill=pf, chunked=chunked, backend=backend),
                      donate_argnums=1) for pf in (False, True)}
  one = m.init_state(cfg.ssm, Bsz, jnp.float32)
  ptp = m.sharding.mixer_to_tp_layout(cfg, n, p)
  _, many, _ = m.sharding.to_tp_layout(cfg.ssm, n, state=m.init_state(cfg.ssm, Bsz, jnp.float32))
  ptp, many = m.sharding.put(mesh, head_axis="tp", batch_axis="dp", params=ptp, state=many)
  rows = np.zeros(Bsz, np.int32)
  for R in Rs:
    pf = R > cfg.ssm.capacity
    hidden = jnp.asarray(rng.normal(0, 1, (Bsz, R, cfg.d_model)), jnp.float32)
    out1, one = m.mixer(cfg, p, one, hidden, rows, prefill=pf, chunked=chunked if pf else None,
                        backend=backend)
    out2, many = runs[pf](ptp, many, hidden, jnp.asarray(rows))
    assert_close(out2, out1, 1e-5, f"out (R={R})")
    _, back, _ = m.sharding.from_tp_layout(cfg.ssm, n, state=many)
    assert_states_close(back, one, 1e-5, f"(R={R})")
    rows = rng.integers(0, min(R, cfg.ssm.capacity), Bsz).astype(np.int32)


def test_reset_entries_checks_shapes():
  cfg = small_cfg()
  state = m.init_state(cfg, 4, jnp.float32)
  with pytest.raises(ValueError, match=r"ssm: expected shape \[1, 4, 8, 16\]"):
    m.reset_entries(state, [2], ssm=jnp.zeros((1, 4, 8, 8)))


class PoolChecks:
  """Pools, padding, reuse, NaN isolation (compiled and interpret variants below)."""

  backend: str

  def test_pool_padding_shuffled_indices_mixed_rows(self):
    pp = PoolPair(self.backend, seed=1)
    pp.call(idx=[3, -1, 11, 0, 7], rows=[0, 0, 0, 0, 0], nrows=[8, 1, 5, 2, 8])
    pp.committed([11, 3, 0, 7], [4, 7, 1, 2])
    pp.call(idx=[11, 3, -1, 7, 0], rows=[4, 7, 0, 2, 1], nrows=[3, 8, 1, 6, 1])
    pp.call(idx=[0, 7, 3, 11, 9], rows=[0, 5, 2, 0, 0], nrows=[8, 4, 8, 2, 7])

  def test_reused_entry_carries_nothing_over(self):
    check_reused_entry(self.backend)

  def test_reset_entries_with_committed_state(self):
    pp = PoolPair(self.backend, seed=3)
    pp.call(idx=[0, 1, 2, 3, 4], rows=[0] * 5, nrows=[8] * 5)
    ssm, conv = pp.committed([2], [5])
    for k in pp.k:
      pp.k[k] = m.reset_entries(pp.k[k], [9], ssm=ssm, conv=conv)
      pp.r[k] = m.reset_entries(pp.r[k], [9], ssm=ssm, conv=conv)
    pp.call(idx=[9, 2, -1, -1, 1], rows=[0, 5, 0, 0, 7], nrows=[8, 8, 1, 1, 3])

  def test_nan_in_one_sequence_changes_nothing_else(self):
    check_nan_isolation(self.backend)

  @pytest.mark.parametrize("mode", ["snapshot", "compact"])
  def test_restored_entry_continues_like_the_original(self, mode):
    """reset_entries with a captured committed state: the new entry continues bitwise like
    the entry it was captured from."""
    cfg = small_cfg(mode=mode)
    p = m.random_params(cfg, 9)
    rng = np.random.default_rng(9)
    state = m.init_state(cfg, 4, jnp.float32)
    xbc, dt = inputs(cfg, 2, 8, rng=rng)
    _, state = m.verify(cfg, p, state, xbc, dt, [0, 0], cache_indices=[0, 1], backend=self.backend)
    ssm, conv = m.committed_state(cfg, p, state, [5], cache_indices=[1], backend=self.backend)
    state = m.reset_entries(state, [3, -1], ssm=jnp.concatenate([ssm, ssm]),
                            conv=jnp.concatenate([conv, conv]))
    x1, d1 = inputs(cfg, 1, 8, rng=rng)
    y, state = m.verify(cfg, p, state, jnp.concatenate([x1, x1]), jnp.concatenate([d1, d1]),
                        [5, 0], cache_indices=[1, 3], backend=self.backend)
    assert_bitwise(np.asarray(y)[0], np.asarray(y)[1], "restored entry vs original")

  @pytest.mark.parametrize("mode", ["snapshot", "compact"])
  def test_shared_entry_rejects_both_sequences(self, mode):
    """A device array addressing one entry from two sequences: both get NaN y and every
    entry is left bitwise as it was, the third sequence runs as alone; host values raise
    before anything runs."""
    cfg = small_cfg(mode=mode)
    p = m.random_params(cfg, 5)
    rng = np.random.default_rng(5)
    state = m.init_state(cfg, 4, jnp.float32)
    xbc, dt = inputs(cfg, 3, 8, rng=rng)
    _, state = m.verify(cfg, p, state, xbc, dt, [0, 0, 0], cache_indices=[0, 1, 2],
                        backend=self.backend)
    before = copy_state(state)
    x2, d2 = inputs(cfg, 3, 4, rng=rng)
    with pytest.raises(ValueError, match=r"sequences \[0, 2\] all address pool entry 1"):
      m.verify(cfg, p, state, x2, d2, [2, 2, 2], cache_indices=[1, 0, 1], backend=self.backend)
    y, state = m.verify(cfg, p, state, x2, d2, jnp.asarray([2, 2, 2], jnp.int32),
                        cache_indices=jnp.asarray([1, 0, 1], jnp.int32), backend=self.backend)
    y = np.asarray(y)
    assert np.isnan(y[[0, 2]]).all() and np.isfinite(y[1]).all()
    alone, _ = m.verify(cfg, p, copy_state(before), x2[1:2], d2[1:2], [2],
                        cache_indices=[0], backend=self.backend)
    assert_bitwise(y[1:2], alone, "the other sequence")
    for name in ("ssm", "conv"):
      for e in (1, 3):
        assert_bitwise(getattr(state, name)[e], getattr(before, name)[e], f"{name}[{e}]")

  @pytest.mark.parametrize("mode", ["snapshot", "compact"])
  def test_committed_state_of_padding_is_zero(self, mode):
    """committed_state fills as verify fills y: padding zeros, an invalid entry NaN."""
    cfg = small_cfg(mode=mode)
    p = m.random_params(cfg, 6)
    state = m.init_state(cfg, 4, jnp.float32)
    xbc, dt = inputs(cfg, 2, 8, rng=np.random.default_rng(6))
    _, state = m.verify(cfg, p, state, xbc, dt, [0, 0], cache_indices=[0, 1],
                        backend=self.backend)
    ssm, conv = m.committed_state(cfg, p, state, jnp.asarray([3, 0, 2], jnp.int32),
                                  cache_indices=jnp.asarray([1, -1, 7], jnp.int32),
                                  backend=self.backend)
    ssm, conv = np.asarray(ssm), np.asarray(conv)
    assert np.isfinite(ssm[0]).all() and (ssm[1] == 0).all() and np.isnan(ssm[2]).all()
    assert (conv[1] == 0).all() and np.isnan(conv[2]).all()


@pytest.mark.gpu
class TestPoolCompiled(PoolChecks):
  backend = "pallas"


class TestPoolInterpret(PoolChecks):
  backend = "interpret"

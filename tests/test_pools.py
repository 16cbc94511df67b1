"""State pools (cache_indices, padding, reuse), per-sequence num_rows, NaN isolation, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import m2v_jax as m
from tests.helpers import (E, SHARDED_VARIANTS, PoolPair, assert_bitwise, check_nan_isolation,
                           check_reused_entry, matrix, check_sharded_mixer, check_sharded_verify,
                           copy_state, dp_tp_mesh, every_case, inputs, small_cfg)



def test_host_checks_for_pools():
  cfg = small_cfg()
  p = m.random_params(cfg, 5)
  st = m.init_state(cfg, E, jnp.float32)
  xbc, dt = inputs(cfg, 3, 4)
  with pytest.raises(ValueError, match=r"cache_indices\[1\]=16: expected -1 \(padding\) or 0 <= index < 16"):
    m.verify(cfg, p, st, xbc, dt, [0, 0, 0], cache_indices=[0, 16, 2])
  with pytest.raises(ValueError, match=r"sequences \[0, 2\] all address pool entry 5"):
    m.verify(cfg, p, st, xbc, dt, [0, 0, 0], cache_indices=[5, 2, 5])
  with pytest.raises(ValueError, match=r"num_rows\[2\]=5: expected 1 <= num_rows <= R=4"):
    m.verify(cfg, p, st, xbc, dt, [0, 0, 0], cache_indices=[0, 1, 2], num_rows=[1, 4, 5])


@pytest.mark.parametrize("mode,window,state_dtype", matrix(SHARDED_VARIANTS, keep={0}))
def test_two_way_head_sharding_matches_one_device(mode, window, state_dtype):
  """A layer with heads over 2 devices (and sequences over 2) equals the one-device run,
  bitwise per head, over verify calls, and a chunked prefill (body + serial tail) in the
  first and last variant (the prefill path is the same in all)."""
  mesh, backend = dp_tp_mesh()
  cfg = m.Mamba2Config(nheads=4, headdim=16, dstate=16, ngroups=2, replay_mode=mode,
                       window=window)
  Rs = (8, 5, 8)
  if (mode, window, state_dtype) in (SHARDED_VARIANTS[0], SHARDED_VARIANTS[-1]):
    Rs = (8, 5, 40, 8) if every_case(backend) else (8, 40, 8)        # with a chunked prefill
  check_sharded_verify(cfg, mesh, backend, jnp.float32, Bsz=4, seed=6, Rs=Rs,
                       state_dtype=state_dtype, chunked=True)


@pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
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


@pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
def test_sharded_mixer_matches_one_device(mode):
  """The mixer layer with heads over 2 devices (sequences over 2) against one device.
  Interpreted: a chunked prefill from a fresh state, then an 8-row verify from mixed rows;
  compiled or with the full matrix: verify 8, a chunked prefill from mixed rows, verify 5."""
  mesh, backend = dp_tp_mesh()
  ssm = m.Mamba2Config(nheads=4, headdim=16, dstate=16, ngroups=2, replay_mode=mode)
  check_sharded_mixer(m.MixerConfig(ssm=ssm, d_model=48), mesh, backend, Bsz=4, seed=3,
                      Rs=(8, 40, 5) if every_case(backend) else (40, 8))


def test_sharded_mixer_checks_the_norm_groups():
  ssm = m.Mamba2Config(nheads=4, headdim=16, dstate=16, ngroups=2)
  cfg = m.MixerConfig(ssm=ssm, d_model=48, norm_groups=1)
  mesh = Mesh(np.array(jax.devices("cpu")[:2]), ("tp",))
  with pytest.raises(ValueError, match="norm's groups=1, got 2"):
    m.sharding.sharded_mixer(mesh, cfg, head_axis="tp")
  with pytest.raises(ValueError, match="out_dtype: sharded_mixer sums the shards' float32"):
    m.sharding.sharded_mixer(mesh, m.MixerConfig(ssm=ssm, d_model=48), head_axis="tp",
                             out_dtype=jnp.bfloat16)


def test_reset_entries_checks_shapes():
  cfg = small_cfg()
  state = m.init_state(cfg, 4, jnp.float32)
  with pytest.raises(ValueError, match=r"ssm: expected shape \[1, 4, 8, 16\]"):
    m.reset_entries(state, [2], ssm=jnp.zeros((1, 4, 8, 8)))


def check_shared_entry_in_a_ragged_prefill(backend, mode):
  """A ragged prefill (R > capacity, num_rows) with a shared entry in a device array: both
  sequences NaN, the pool as it was, invalid_sequences marks them."""
  cfg = small_cfg(mode=mode, headdim=16)
  p = m.random_params(cfg, 7)
  state = m.init_state(cfg, 3, jnp.float32)
  before = copy_state(state)
  xbc, dt = inputs(cfg, 2, 12, rng=np.random.default_rng(7))
  ci = jnp.asarray([1, 1], jnp.int32)
  bad = m.invalid_sequences(cfg, state, jnp.zeros(2, jnp.int32), 12, cache_indices=ci)
  assert np.asarray(bad).tolist() == [True, True]
  y, state = m.prefill(cfg, p, state, xbc, dt, [0, 0], cache_indices=ci, num_rows=[12, 10],
                       backend=backend)
  assert np.isnan(np.asarray(y)).all()
  for name in type(state)._fields:
    assert_bitwise(getattr(state, name), getattr(before, name), name)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_shared_entry_in_a_ragged_reference_prefill(mode):
  check_shared_entry_in_a_ragged_prefill("reference", mode)


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

  @pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
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
    for name in type(state)._fields:
      for e in (1, 3):
        assert_bitwise(getattr(state, name)[e], getattr(before, name)[e], f"{name}[{e}]")

  @pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
  def test_shared_entry_in_a_ragged_prefill(self, mode):
    check_shared_entry_in_a_ragged_prefill(self.backend, mode)

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

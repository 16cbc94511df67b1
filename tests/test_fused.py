"""The one-launch verify path (`TileConfig.fused`) against the two launches, bitwise."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import dispatch, status
from m2v_jax.kernels import tiles as tiles_lib
from tests.helpers import assert_bitwise, dev, inputs, random_state, small_cfg


def run_both(backend, cfg, dtype, R, calls=3, E=5, gate=False, seed=0):
  """`calls` calls of R rows through both paths from one pool; asserts y and every state leaf
  bitwise equal after each. Sequences: live entries, a padding one, short `num_rows`."""
  p = m.random_params(cfg, seed)
  base = tiles_lib.tile_config(cfg)
  rng = np.random.default_rng(seed)
  start = random_state(cfg, E, dtype, rng=rng)
  states = {f: jax.tree.map(jnp.array, start) for f in (0, 1)}
  rows = np.zeros(3, np.int32)
  for k in range(calls):
    xbc, dt = inputs(cfg, 3, R, dtype, rng=rng)
    z = dev(rng.normal(size=(3, R, cfg.d_inner)), dtype) if gate else None
    ci = jnp.asarray([3, -1, 1] if k % 2 else [0, 2, 4], jnp.int32)
    nr = jnp.asarray([R, R, max(1, R - 1 - k % 2)], jnp.int32)
    args = status.call_args(xbc, dt, jnp.asarray(rows), z, ci, nr)
    outs = []
    for f in (0, 1):
      y, states[f] = dispatch.kernel_call(cfg, backend, p, states[f], args,
                                          tiles=dataclasses.replace(base, fused=f))
      outs.append((y, states[f]))
    assert_bitwise(outs[1][0], outs[0][0], f"y, call {k}")
    for name, a, b in zip(type(start)._fields, outs[1][1], outs[0][1]):
      assert_bitwise(a, b, f"{name}, call {k}")
    rows = rng.integers(0, min(R, cfg.capacity), 3).astype(np.int32)


class FusedChecks:
  backend = None
  capacity = 4

  def cfg(self, mode, **kw):
    return small_cfg(capacity=self.capacity, mode=mode, **kw)

  @pytest.mark.parametrize("mode", ["snapshot", "compact"])
  def test_float32(self, mode):
    run_both(self.backend, self.cfg(mode), jnp.float32, R=self.capacity)

  def test_deferred_bf16(self):
    run_both(self.backend, self.cfg("compact", window=16), jnp.bfloat16, R=self.capacity,
             calls=4)

  def test_snapshot_gate_short_call(self):
    run_both(self.backend, self.cfg("snapshot"), jnp.bfloat16, R=3, gate=True)


@pytest.mark.gpu
class TestFusedCompiled(FusedChecks):
  backend = "pallas"
  capacity = 8

  def cfg(self, mode, **kw):
    return m.BOLT.replace(replay_mode=mode, **kw)


class TestFusedInterpret(FusedChecks):
  backend = "interpret"

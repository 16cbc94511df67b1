"""Deferred commit (`Mamba2Config.window`): compact mode keeps accepted rows pending across calls
and writes the base only on a flush; both modes stay bitwise identical after every call."""

import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from tests.helpers import (assert_bitwise, copy_state, inputs, mark_16bit_float32_parity_gap,
                           matrix, small_cfg)


class WindowModel:
  """What the window should hold: per sequence the pending rows, the window row where the last
  call's rows start, and whether a call writes the base (docs/semantics.md)."""

  def __init__(self, cfg, B):
    self.W, self.cap = cfg.window_rows, cfg.capacity
    self.pending = np.zeros(B, int)
    self.first = np.zeros(B, int)

  def call(self, R, rows, n):
    writes = np.zeros(len(rows), bool)
    for b, (row, nb) in enumerate(zip(rows, n)):
      n_rep = self.first[b] + row + 1 if self.pending[b] else 0
      flush = R > self.cap or n_rep + nb > self.W
      writes[b] = R > self.cap or (flush and n_rep > 0)
      self.first[b] = 0 if flush else n_rep
      self.pending[b] = self.first[b] + (min(R, self.cap) if R > self.cap else nb)
    return writes


def _check_window(state, model):
  assert np.asarray(state.pending).tolist() == model.pending.tolist()
  starts = np.asarray(state.starts)
  last = [max([j for j in range(32) if s >> j & 1], default=0) for s in starts]
  assert last == model.first.tolist()


class DeferredChecks:
  """Both modes over random decode loops with prefills between (compiled and interpret)."""

  backend: str

  @pytest.mark.parametrize("window,state_dtype,act", matrix([
      (16, jnp.float32, jnp.float32), (32, jnp.float32, jnp.float32),
      (16, jnp.bfloat16, jnp.float32), (32, jnp.float16, jnp.float32),
      (16, jnp.bfloat16, jnp.bfloat16), (32, jnp.float16, jnp.bfloat16)], keep={1, 5}))
  def test_modes_agree_and_flush_where_expected(self, window, state_dtype, act, request):
    mark_16bit_float32_parity_gap(request, self.backend, state_dtype, act)
    snap = small_cfg(window=window)
    comp = snap.replace(replay_mode="compact")
    p = m.random_params(snap, window)
    rng = np.random.default_rng(window)
    B = 3
    s = m.init_state(snap, B, act, state_dtype=state_dtype)
    c = m.init_state(comp, B, act, state_dtype=state_dtype)
    model = WindowModel(comp, B)
    rows, last_R, base_writes = np.zeros(B, np.int32), 0, 0
    for step in range(24):
      R = 20 if step in (0, 13) else 8
      xbc, dt = inputs(snap, B, R, act, rng=rng)
      n = np.full(B, R) if R > 8 else rng.integers(1, R + 1, B)
      kw = {} if R > 8 else dict(num_rows=n.astype(np.int32))
      fn = m.prefill if R > 8 else m.verify
      before = np.asarray(c.ssm).copy()
      ys, s = fn(snap, p, s, xbc, dt, rows, backend=self.backend, **kw)
      yc, c = fn(comp, p, c, xbc, dt, rows, backend=self.backend, **kw)
      assert_bitwise(ys, yc, f"y at step {step}")
      writes = model.call(R, rows, n)
      changed = [not np.array_equal(before[b], np.asarray(c.ssm)[b]) for b in range(B)]
      assert changed == writes.tolist(), (step, changed, writes)
      base_writes += int(writes.sum())
      _check_window(c, model)
      last_R = int(min(R, 8))
      rows = np.minimum(rng.geometric(0.35, B) - 1, n - 1 if R <= 8 else last_R - 1)
      rows = rows.astype(np.int32)
      a = m.committed_state(snap, p, s, rows, backend=self.backend)
      b = m.committed_state(comp, p, c, rows, backend=self.backend)
      assert_bitwise(a[0], b[0], f"committed ssm at step {step}")
      assert_bitwise(a[1], b[1], f"committed conv at step {step}")
    # Fewer base writes than calls that replayed something: the point of deferring.
    assert base_writes < 24 * B - 6, base_writes

  @pytest.mark.parametrize("state_dtype,act", matrix([(jnp.float32, jnp.float32),
                                                       (jnp.bfloat16, jnp.float32),
                                                       (jnp.bfloat16, jnp.bfloat16)], keep={2}))
  def test_full_window_of_32_rows(self, state_dtype, act, request):
    """Calls that fill all 32 window rows (the last call's rows from row 31: bit 31 of
    `starts`), then one that flushes: parity, `pending` and `starts` as expected."""
    mark_16bit_float32_parity_gap(request, self.backend, state_dtype, act)
    snap = small_cfg(window=32)
    comp = snap.replace(replay_mode="compact")
    p = m.random_params(snap, 13)
    rng = np.random.default_rng(13)
    s = m.init_state(snap, 1, act, state_dtype=state_dtype)
    c = m.init_state(comp, 1, act, state_dtype=state_dtype)
    plan = [(8, 0, 8, 0x1), (8, 7, 16, 0x101), (8, 7, 24, 0x10101), (8, 6, 31, 0x810101),
            (1, 7, 32, 0x80810101 - 2**32), (3, 0, 3, 0x1)]
    for R, row, pending, starts in plan:
      xbc, dt = inputs(snap, 1, R, act, rng=rng)
      rows = np.array([row], np.int32)
      ys, s = m.verify(snap, p, s, xbc, dt, rows, backend=self.backend)
      yc, c = m.verify(comp, p, c, xbc, dt, rows, backend=self.backend)
      assert_bitwise(ys, yc, f"y of the call with pending {pending}")
      assert np.asarray(c.pending).tolist() == [pending]
      assert np.asarray(c.starts).tolist() == [starts]
    a = m.committed_state(snap, p, s, np.array([2], np.int32), backend=self.backend)
    b = m.committed_state(comp, p, c, np.array([2], np.int32), backend=self.backend)
    assert_bitwise(a[0], b[0], "committed ssm")

  def test_pool_entries_padding_and_a_row_past_the_last_call(self):
    """A pool of 5 entries addressed out of order with padding; a `state_row` below the
    pending count but past the last call's rows is rejected on the device (entry untouched)."""
    snap = small_cfg(window=16)
    comp = snap.replace(replay_mode="compact")
    p = m.random_params(snap, 12)
    rng = np.random.default_rng(12)
    ci = jnp.asarray([3, -1, 0], jnp.int32)
    pools = {cfg.replay_mode: m.init_state(cfg, 5, jnp.float32) for cfg in (snap, comp)}
    for rows, R in (([0, 0, 0], 4), ([1, 0, 2], 3), ([2, 0, 0], 5)):
      xbc, dt = inputs(snap, 3, R, rng=rng)
      out = {}
      for cfg in (snap, comp):
        y, pools[cfg.replay_mode] = m.verify(cfg, p, pools[cfg.replay_mode], xbc, dt,
                                             jnp.asarray(rows, jnp.int32), cache_indices=ci,
                                             backend=self.backend)
        out[cfg.replay_mode] = np.asarray(y)
      assert_bitwise(out["snapshot"], out["compact"], f"y at rows {rows}")
      assert not np.any(out["compact"][1]), "padding y is 0"
    c = pools["compact"]
    assert np.asarray(c.pending)[[3, 0]].tolist() == [(2 + 2 + 1) + 5, (3 + 0 + 1) + 5]
    before = copy_state(c)
    xbc, dt = inputs(snap, 3, 2, rng=rng)
    y, after = m.verify(comp, p, c, xbc, dt, jnp.asarray([5, 0, 1], jnp.int32),
                        cache_indices=ci, backend=self.backend)
    assert np.all(np.isnan(np.asarray(y)[0])) and not np.any(np.isnan(np.asarray(y)[2]))
    for name, a, b in zip(type(after)._fields, after, before):
      assert_bitwise(np.asarray(a)[3], b[3], f"rejected entry 3 {name}")


@pytest.mark.gpu
class TestDeferredCompiled(DeferredChecks):
  backend = "pallas"


class TestDeferredInterpret(DeferredChecks):
  backend = "interpret"


@pytest.mark.parametrize("window", [4, 12, 64, True])
def test_window_is_checked(window):
  with pytest.raises(ValueError, match="window: expected a power of two in"):
    small_cfg(window=window)


def test_window_memory():
  """Bolt geometry, bf16 activations: each ring row holds 18 KiB of post-conv x and B and
  512 B of dt; the window adds W - capacity ring rows."""
  for W in (16, 32):
    cfg = m.BOLT.replace(replay_mode="compact", window=W)
    deferred = m.state_shapes(cfg, 1, jnp.bfloat16)
    default = m.state_shapes(cfg.replace(window=None), 1, jnp.bfloat16)
    size = lambda t: sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in t)
    assert size(deferred) - size(default) == (W - 8) * ((8192 + 1024) * 2 + 128 * 4)

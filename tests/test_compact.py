"""Compact replay mode: bitwise parity with snapshot mode, hand-offs, resets, bad selectors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import dispatch, status
from tests.helpers import (dev, Pair, assert_bitwise, assert_close, copy_state, every_case, inputs,
                           matrix, small_cfg)


def modes_under_user_jit(backend):
  """Both modes through a jitted step that closes over the params (XLA sees them as
  constants), then the committed state: returns {mode: (y, committed ssm, committed conv)}."""
  import jax
  out = {}
  for mode in ("snapshot", "compact"):
    cfg = small_cfg(mode=mode, headdim=16, dstate=32, nheads=8)
    p = m.random_params(cfg, 0)          # 8 heads: some exp(A_log) fold an ulp off
    rng = np.random.default_rng(0)
    state = m.state_from_committed(
        cfg, dev(rng.normal(0, 0.5, (2, cfg.nheads, cfg.headdim, cfg.dstate)), jnp.float32),
        jnp.zeros((2, cfg.conv_dim, cfg.d_conv - 1), jnp.float32), jnp.float32)
    xbc, dt = inputs(cfg, 2, 4, rng=rng)
    step = jax.jit(lambda s, x, d, cfg=cfg, p=p: m.verify(cfg, p, s, x, d, jnp.zeros(2, jnp.int32),
                                                        backend=backend))
    y, state = step(state, xbc, dt)
    out[mode] = (y,) + tuple(m.committed_state(cfg, p, state, [3, 1], backend=backend))
  return out


def check_modes_under_user_jit(backend):
  out = modes_under_user_jit(backend)
  for i, what in enumerate(("y", "committed ssm", "committed conv")):
    assert_bitwise(out["snapshot"][i], out["compact"][i], what)


def test_modes_agree_under_user_jit_reference():
  """The reference backend's modes agree bitwise when a user's jit closes over the params."""
  check_modes_under_user_jit("reference")


def test_compact_memory_is_one_state_plus_window():
  cfg = m.BOLT.replace(replay_mode="compact")
  shapes = m.state_shapes(cfg, 1, jnp.bfloat16)
  nbytes = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in shapes)
  one_state = 128 * 64 * 128 * 4 + 10240 * 3 * 2
  last_rows = 8 * 10240 * 2                          # raw xBC of the last call's rows
  ring = 16 * ((8192 + 1024) * 2 + 128 * 4)           # x|B and dt, W + capacity rows
  window = last_rows + ring + 3 * 4 + 8 * 4          # pending, starts, origin; last_bits
  assert nbytes == one_state + window
  snap = m.state_shapes(m.BOLT, 1, jnp.bfloat16)
  assert sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in snap) == 8 * one_state


class CompactChecks:
  """Compact replay against snapshot mode, bitwise (compiled and interpret variants below)."""

  backend: str

  def test_multi_round_verify_partial_acceptance(self):
    pair = Pair(self.backend)
    pair.call(8)
    for rows in ([0, 0, 0], [3, 3, 3], [7, 7, 7], [0, 3, 7], None, None):
      pair.accept(pair.random_rows() if rows is None else rows)
      pair.call(8)

  def test_prefill_handoff_then_verify(self):
    """An R=37 prefill into capacity 8 hands off through state_row = 7, then R=8 verifies."""
    pair = Pair(self.backend, seed=1)
    pair.call(37)
    pair.accept([7, 7, 7])
    pair.call(8)
    pair.accept([2, 5, 7])
    pair.call(8)
    pair.accept([4, 0, 1])

  def test_prefill_while_window_pending(self):
    """An R=37 chunk arriving while rows are pending: the pre-pass folds them first."""
    pair = Pair(self.backend, seed=2)
    pair.call(8)
    pair.accept([5, 2, 0])
    pair.call(37)
    pair.accept([7, 3, 6])
    pair.call(5)
    pair.accept([4, 4, 4])

  @pytest.mark.parametrize("capacity", matrix([8, 16], keep={0}))
  def test_row_counts_and_capacities(self, capacity):
    pair = Pair(self.backend, capacity=capacity, seed=capacity)
    # Interpreted (each R is two more programs): one row, part of, all of and one past the
    # capacity, and a long prefill.
    for R in (1, 5, 7, 8, 9, 12, 16, 37) if every_case(self.backend) else (1, 5, 8, 9, 37):
      pair.call(R)
      pair.accept(pair.random_rows())

  def test_reset_replays_identically(self):
    """Two passes over the same calls with a full reset between them give the same results."""
    pair = Pair(self.backend, seed=3)
    plan = [(8, None), (8, [3, 6, 0]), (37, [7, 0, 5]), (4, [7, 7, 2]), (8, [1, 2, 3])]
    rng = np.random.default_rng(30)
    data = [inputs(pair.snap, 3, R, rng=rng) for R, _ in plan]

    def run(state, cfg):
      ys, rows = [], np.zeros(3, np.int32)
      for (R, r), (xbc, dt) in zip(plan, data):
        rows = rows if r is None else np.asarray(r, np.int32)
        fn = m.verify if R <= cfg.capacity else m.prefill
        y, state = fn(cfg, pair.p, state, xbc, dt, rows, backend=self.backend)
        ys.append(np.asarray(y))
      return ys, state

    for cfg, state in ((pair.comp, pair.c), (pair.snap, pair.s)):
      first, state = run(state, cfg)
      state = m.reset_state(state)
      for leaf in state:
        assert not np.any(np.asarray(leaf)), "a reset leaves nothing behind"
      second, state = run(state, cfg)
      for a, b in zip(first, second):
        assert_bitwise(a, b, f"{cfg.replay_mode}: second pass")

  @pytest.mark.parametrize("window", matrix([None, 16, 32], keep={0, 2}))
  def test_forty_steps_random_acceptance_against_reference(self, window):
    """40 verify calls of 3 or 8 rows, each sequence with its own random num_rows and
    accepted row: compact kernels vs the jax.numpy reference, without and with deferred
    commit (the window's bookkeeping equal too). Two call shapes, each with sequences of all
    and of fewer of its rows; a window both defers and flushes."""
    cfg = small_cfg(mode="compact", window=window)
    p = m.random_params(cfg, 4)
    rng = np.random.default_rng(4)
    B = 3
    k = m.init_state(cfg, B, jnp.float32)
    r = m.init_state(cfg, B, jnp.float32)
    rows = np.zeros(B, np.int32)
    seen = set()
    for step in range(40):
      R = int(rng.choice([3, 8]))
      n = rng.integers(1, R + 1, B).astype(np.int32)
      xbc, dt = inputs(cfg, B, R, rng=rng)
      held = np.asarray(k.pending)
      yk, k = m.verify(cfg, p, k, xbc, dt, rows, num_rows=n, backend=self.backend)
      yr, r = m.verify(cfg, p, r, xbc, dt, rows, num_rows=n, backend="reference")
      assert_close(yk, yr, 1e-5, f"y at step {step}")
      assert_bitwise(k.pending, r.pending, f"pending at step {step}")
      assert_bitwise(k.starts, r.starts, f"starts at step {step}")
      pending = np.asarray(k.pending)
      seen |= {f"{'full' if nb == R else 'short'} R={R}" for nb in n}
      seen |= {"deferred" for b in range(B) if pending[b] > n[b]}
      seen |= {"flushed" for b in range(B) if held[b] > 0 and pending[b] == n[b]}
      rows = rng.integers(0, n).astype(np.int32)
    assert seen == ({"full R=3", "short R=3", "full R=8", "short R=8", "flushed"}
                    | ({"deferred"} if window else set())), seen
    a = m.committed_state(cfg, p, k, rows, backend=self.backend)
    b = m.committed_state(cfg, p, r, rows, backend="reference")
    assert_close(a[0], b[0], 1e-5, "final committed ssm")
    assert_close(a[1], b[1], 1e-6, "final committed conv")

  @pytest.mark.parametrize("bad", [-1, 8, 5])          # negative, >= capacity, >= pending (5)
  def test_invalid_selector_leaves_state_intact(self, bad):
    cfg = small_cfg(mode="compact")
    p = m.random_params(cfg, 5)
    rng = np.random.default_rng(5)
    B = 3
    state = m.init_state(cfg, B, jnp.float32)
    xbc, dt = inputs(cfg, B, 5, rng=rng)
    _, state = m.verify(cfg, p, state, xbc, dt, np.zeros(B, np.int32), backend=self.backend)
    before = copy_state(state)
    rows = jnp.asarray([bad, 2, 4], jnp.int32)          # device values: checked in the kernels
    xbc, dt = inputs(cfg, B, 3, rng=rng)
    y, after = m.verify(cfg, p, state, xbc, dt, rows, backend=self.backend)
    assert np.all(np.isnan(np.asarray(y)[0]))
    assert not np.any(np.isnan(np.asarray(y)[1:]))
    for name, a, b in zip(type(after)._fields, after, before):
      assert_bitwise(np.asarray(a)[0], b[0], f"sequence 0 {name}")
    assert np.asarray(after.pending).tolist() == [5, 3, 3]
    state = m.CompactState(*map(jnp.asarray, before))
    host_rows = np.array([bad, 2, 4], np.int32)
    if not 0 <= bad < cfg.capacity:
      # Outside [0, W): the host check names the sequence and the range, before any launch.
      with pytest.raises(ValueError, match=rf"state_row\[0\]={bad}: expected 0 <= state_row < "
                                           rf"capacity={cfg.capacity}"):
        m.verify(cfg, p, state, xbc, dt, host_rows, backend=self.backend)
      for a, b in zip(state, before):
        assert_bitwise(a, b, "state after the rejected call")
    else:
      # In [0, W) but at or past the pending rows: the host does not read the pool's pending
      # counts, so the kernels reject it exactly as they do a device value.
      y_host, after_host = m.verify(cfg, p, state, xbc, dt, host_rows, backend=self.backend)
      assert_bitwise(np.asarray(y_host), np.asarray(y), "y of host vs device state_row")
      for name, a, b in zip(type(after)._fields, after_host, after):
        assert_bitwise(a, b, f"{name} of host vs device state_row")

  def test_nothing_pending_requires_row_zero(self):
    cfg = small_cfg(mode="compact")
    p = m.random_params(cfg, 6)
    state = m.init_state(cfg, 2, jnp.float32)
    xbc, dt = inputs(cfg, 2, 3)
    # Host and device values alike: nothing pending, so only row 0 is accepted (checked in
    # the kernels; the host check does not read the pending counts).
    for rows in (np.array([0, 1], np.int32), jnp.asarray([0, 1], jnp.int32)):
      y, after = m.verify(cfg, p, m.init_state(cfg, 2, jnp.float32), xbc, dt, rows,
                          backend=self.backend)
      assert np.all(np.isnan(np.asarray(y)[1])) and not np.any(np.isnan(np.asarray(y)[0]))
      assert np.asarray(after.pending).tolist() == [3, 0]
    _, _, err = m.verify_checked(cfg, p, state, xbc, dt, np.array([0, 1], np.int32),
                                 backend=self.backend)
    assert "state_row rejected for sequence 1: state_row=1" in err.get()

  def test_committed_state_restore_and_conversion(self):
    """Capture the committed state in compact mode, restore it in either mode, continue alike."""
    pair = Pair(self.backend, seed=7, B=2)
    pair.call(8)
    ssm, conv = pair.accept([6, 2])
    xbc, dt = inputs(pair.snap, 2, 8, rng=np.random.default_rng(70))
    ys = []
    for cfg in (pair.snap, pair.comp):
      restored = m.state_from_committed(cfg, ssm, conv, jnp.float32)
      y, _ = m.verify(cfg, pair.p, restored, xbc, dt, np.zeros(2, np.int32), backend=self.backend)
      ys.append(np.asarray(y))
    converted = m.convert_state(pair.comp, pair.p, pair.c, np.array([6, 2], np.int32), pair.snap,
                                backend=self.backend)
    y, _ = m.verify(pair.snap, pair.p, converted, xbc, dt, np.zeros(2, np.int32),
                    backend=self.backend)
    y_cont, _ = m.verify(pair.comp, pair.p, pair.c, xbc, dt, np.array([6, 2], np.int32),
                         backend=self.backend)
    assert_bitwise(ys[0], ys[1], "restored snapshot vs restored compact")
    assert_bitwise(ys[0], y, "converted")
    assert_bitwise(ys[0], y_cont, "continuing in place")

  @pytest.mark.parametrize("variant", [dict(n_cols=8), dict(block_p=4), dict(num_warps=2)])
  def test_modes_agree_bitwise_at_other_tiles(self, variant):
    """Other tiles change the order of the products' sums, the same in both modes: the
    modes stay bitwise equal to each other and within float32 rounding of the default."""
    import dataclasses
    base = m.tile_config(small_cfg())
    tiles = dataclasses.replace(base, **variant)
    call = jax.jit(dispatch.kernel_call, static_argnums=(0, 1, 5))
    out = {}
    for mode in ("snapshot", "compact"):
      cfg = small_cfg(mode=mode)
      p = m.random_params(cfg, 8)
      for name, t in (("default", base), ("variant", tiles)):
        state = m.init_state(cfg, 2, jnp.float32)
        ci, nr = jnp.arange(2, dtype=jnp.int32), jnp.asarray([8, 5], jnp.int32)
        data = [inputs(cfg, 2, 8, rng=np.random.default_rng(80 + k)) for k in range(2)]
        _, state = call(cfg, self.backend, p, state, status.call_args(
            *data[0], jnp.zeros(2, jnp.int32), None, ci, nr), t)
        y, state = call(cfg, self.backend, p, state, status.call_args(
            *data[1], jnp.asarray([6, 3], jnp.int32), None, ci, jnp.asarray([7, 8], jnp.int32)),
            t)
        committed = m.committed_state(cfg, p, state, np.array([4, 2], np.int32),
                                      backend=self.backend)
        out[mode, name] = (y, committed[0])
    for name in ("default", "variant"):
      assert_bitwise(out["snapshot", name][0], out["compact", name][0], f"{name} y")
      assert_bitwise(out["snapshot", name][1], out["compact", name][1], f"{name} state")
    assert_close(out["compact", "variant"][0], out["compact", "default"][0], 1e-6, "y")
    assert_close(out["compact", "variant"][1], out["compact", "default"][1], 1e-6, "state")

  def test_modes_agree_under_user_jit(self):
    """A jitted step that closes over the params: the modes' y and committed states agree
    bitwise (XLA may fold what it sees as constants, differently from the runtime)."""
    check_modes_under_user_jit(self.backend)

  def test_convert_snapshot_with_float32_conv_to_compact(self):
    """bf16 activations with a float32 conv state convert to a bf16 compact pool."""
    snap = small_cfg()
    comp = snap.replace(replay_mode="compact")
    p = m.random_params(snap, 9)
    rng = np.random.default_rng(9)
    state = m.init_state(snap, 2, jnp.bfloat16, conv_dtype=jnp.float32)
    xbc, dt = inputs(snap, 2, 8, jnp.bfloat16, rng=rng)
    _, state = m.verify(snap, p, state, xbc, dt, [0, 0], backend=self.backend)
    converted = m.convert_state(snap, p, state, [4, 6], comp, dtype=jnp.bfloat16,
                                backend=self.backend)
    assert converted.win_xb.dtype == jnp.bfloat16 and converted.conv.dtype == jnp.float32
    y_c, _ = m.verify(comp, p, converted, xbc, dt, [0, 0], backend=self.backend)
    y_s, _ = m.verify(snap, p, state, xbc, dt, [4, 6], backend=self.backend)
    assert_bitwise(y_c, y_s, "converted pool continues like the original")


@pytest.mark.gpu
class TestCompactCompiled(CompactChecks):
  backend = "pallas"


class TestCompactInterpret(CompactChecks):
  backend = "interpret"

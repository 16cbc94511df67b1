"""16-bit state storage (`state_dtype` bfloat16 / float16): where it rounds, and what holds.

What holds: the two modes stay bitwise identical (verify calls, prefill hand-offs serial and
chunked, committed states, conversion); within one call the math is float32, so a call from a
start state that the 16-bit dtype represents gives bitwise the y of a float32 pool and stores
its states rounded to nearest-even; the kernels match the jax.numpy reference, which rounds
at the same places. What does not: one call of R rows against R calls of one row (each call
rounds its start state).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from tests.helpers import (matrix, assert_bitwise, assert_close, copy_state, inputs,
                           mark_16bit_float32_parity_gap, small_cfg)

STATE_DTYPES = [jnp.bfloat16, jnp.float16]
# (R, state_row) of B=3 calls: a serial prefill hand-off, then verify calls with changing rows,
# a serial prefill whose 37-row body ends in a partial segment, and a verify call after it.
CALLS = [(13, [0, 0, 0]), (8, [2, 7, 4]), (5, [7, 0, 3]), (8, [1, 4, 0]), (45, [4, 2, 1]),
         (3, [6, 1, 7])]


def _run_modes(backend, state_dtype, calls, cfg=None, B=3, seed=0, chunked=None,
               act=jnp.float32):
  """Runs the same calls [(R, state_row)] in both modes from zero pools, activations of
  dtype `act`; returns per mode (the y of every call, the final pool, the params)."""
  snap = cfg or small_cfg()
  out = {}
  for c in (snap, snap.replace(replay_mode="compact")):
    p = m.random_params(c, seed)
    rng = np.random.default_rng(seed)
    state = m.init_state(c, B, act, state_dtype=state_dtype)
    ys = []
    for R, rows in calls:
      xbc, dt = inputs(c, B, R, act, rng=rng)
      rows = np.asarray(rows, np.int32)
      if R > c.capacity:
        y, state = m.prefill(c, p, state, xbc, dt, rows, backend=backend, chunked=chunked)
      else:
        y, state = m.verify(c, p, state, xbc, dt, rows, backend=backend)
      ys.append(np.asarray(y))
    out[c.replay_mode] = (ys, state, p)
  return out


class StateDtypeChecks:
  """Kernels with a 16-bit state pool (compiled and interpret variants below)."""

  backend: str

  # Interpreted, a float16 state runs in test_deferred (with bfloat16 activations).
  @pytest.mark.parametrize("state_dtype,act", matrix(
      [(s, a) for s in STATE_DTYPES for a in (jnp.float32, jnp.bfloat16)], keep={0}))
  def test_modes_agree_bitwise(self, state_dtype, act, request):
    """Serial prefill hand-off (R > capacity: rounded where compact commits), then verify
    calls with changing state_row; y after every call and the committed states agree."""
    mark_16bit_float32_parity_gap(request, self.backend, state_dtype, act)
    out = _run_modes(self.backend, state_dtype, CALLS, act=act)
    (ys_s, st_s, p), (ys_c, st_c, _) = out["snapshot"], out["compact"]
    for i, (a, b) in enumerate(zip(ys_s, ys_c)):
      assert_bitwise(a, b, f"y of call {i}")
    assert st_s.ssm.dtype == st_c.ssm.dtype == jnp.dtype(state_dtype)
    rows = np.array([2, 0, 1], np.int32)
    cs = m.committed_state(small_cfg(), p, st_s, rows, backend=self.backend)
    cc = m.committed_state(small_cfg(mode="compact"), p, st_c, rows, backend=self.backend)
    assert cs[0].dtype == jnp.float32
    assert_bitwise(cs[0], cc[0], "committed ssm")
    assert_bitwise(cs[1], cc[1], "committed conv")
    # Every committed state is a value of the storage dtype.
    assert_bitwise(np.asarray(cs[0]).astype(state_dtype).astype(np.float32), cs[0],
                   "committed ssm is representable")

  @pytest.mark.parametrize("act", matrix([jnp.float32, jnp.bfloat16], keep={1}))
  def test_chunked_prefill_hand_off_agrees_bitwise(self, act, request):
    mark_16bit_float32_parity_gap(request, self.backend, jnp.bfloat16, act)
    cfg = small_cfg(headdim=16)
    calls = [(8 + 70, [0, 0]), (8, [5, 2]), (8, [3, 7])]
    out = _run_modes(self.backend, jnp.bfloat16, calls, cfg=cfg, B=2, seed=3, chunked=True,
                     act=act)
    for i, (a, b) in enumerate(zip(out["snapshot"][0], out["compact"][0])):
      assert_bitwise(a, b, f"y of call {i}")

  @pytest.mark.parametrize("mode", ["snapshot", "compact"])
  def test_one_call_is_float32_math_rounded_at_store(self, mode):
    """From a start state the 16-bit dtype holds (zeros), one call's y is bitwise a float32
    pool's; snapshot slots (compact: the base at the next call) are its states rounded."""
    cfg = small_cfg(mode=mode)
    p = m.random_params(cfg, 4)
    xbc, dt = inputs(cfg, 2, 8, rng=np.random.default_rng(4))
    res = {}
    for sdt in (jnp.float32, jnp.bfloat16):
      state = m.init_state(cfg, 2, jnp.float32, state_dtype=sdt)
      y, state = m.verify(cfg, p, state, xbc, dt, [0, 0], backend=self.backend)
      res[sdt] = (np.asarray(y), state)
    assert_bitwise(res[jnp.float32][0], res[jnp.bfloat16][0], "y")
    rows = np.array([6, 3], np.int32)
    a = m.committed_state(cfg, p, res[jnp.float32][1], rows, backend=self.backend)[0]
    b = m.committed_state(cfg, p, res[jnp.bfloat16][1], rows, backend=self.backend)[0]
    assert_bitwise(np.asarray(a).astype(jnp.bfloat16).astype(np.float32), b,
                   "16-bit committed state = float32 one rounded to nearest-even")

  def test_matches_reference(self):
    """Kernels against the jax.numpy reference (which rounds at the same places). Interpret
    mode matches it bitwise here; compiled kernels fuse multiply-adds, so a rare state element
    can round to the neighbouring 16-bit value. The tolerances are at most a fifth of what
    storing the state in bfloat16 changes (y 1.1-3.3e-4, state 1.5-1.7e-3 against a float32
    pool), so a missing or extra rounding fails."""
    # The calls and pools of the parity test's (bfloat16 state, float32 activations) case:
    # interpreted, its programs.
    got = _run_modes(self.backend, jnp.bfloat16, CALLS)
    ref = _run_modes("reference", jnp.bfloat16, CALLS)
    for mode in ("snapshot", "compact"):
      for i, (a, b) in enumerate(zip(got[mode][0], ref[mode][0])):
        assert_close(a, b, 2e-5, f"{mode} y of call {i}")
      assert_close(got[mode][1].ssm.astype(jnp.float32), ref[mode][1].ssm.astype(jnp.float32),
                   2e-4, f"{mode} final ssm")

  def test_rejected_sequence_keeps_its_16bit_entry(self):
    cfg = small_cfg(mode="compact")
    p = m.random_params(cfg, 6)
    rng = np.random.default_rng(6)
    state = m.init_state(cfg, 2, jnp.float32, state_dtype=jnp.bfloat16)
    xbc, dt = inputs(cfg, 2, 8, rng=rng)
    _, state = m.verify(cfg, p, state, xbc, dt, [0, 0], backend=self.backend)
    before = copy_state(state)
    y, after = m.verify(cfg, p, state, xbc, dt, jnp.asarray([9, 2], jnp.int32),
                        backend=self.backend)
    assert np.all(np.isnan(np.asarray(y)[0])) and not np.any(np.isnan(np.asarray(y)[1]))
    for name, a, b in zip(type(after)._fields, after, before):
      assert_bitwise(np.asarray(a)[0], b[0], f"sequence 0 {name}")


@pytest.mark.gpu
class TestStateDtypeCompiled(StateDtypeChecks):
  backend = "pallas"


class TestStateDtypeInterpret(StateDtypeChecks):
  backend = "interpret"


def test_16bit_state_halves_the_state_memory():
  """Bolt geometry: 4 MiB of float32 state per entry becomes 2 MiB; the compact entry (base,
  conv, window) shrinks from 4.5 to 2.5 MiB, so a fixed budget holds 1.8x the sequences."""
  for mode, states in (("snapshot", 8), ("compact", 1)):
    cfg = m.BOLT.replace(replay_mode=mode)
    f32 = m.state_shapes(cfg, 1, jnp.bfloat16)
    b16 = m.state_shapes(cfg, 1, jnp.bfloat16, state_dtype=jnp.bfloat16)
    assert b16.ssm.dtype == jnp.bfloat16
    size = lambda t: sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in t)
    assert size(f32) - size(b16) == states * 2 * 2**20


def test_bad_state_dtype_is_rejected_and_loses_no_state():
  cfg = small_cfg()
  with pytest.raises(TypeError, match="state_dtype: expected float32, bfloat16 or float16"):
    m.init_state(cfg, 2, jnp.float32, state_dtype=jnp.int8)
  p = m.random_params(cfg)
  state = m.init_state(cfg, 2, jnp.float32)
  state = state._replace(ssm=jnp.zeros(state.ssm.shape, jnp.int32))
  xbc, dt = inputs(cfg, 2, 4)
  with pytest.raises(TypeError, match="state.ssm: expected dtype float32 or bfloat16 or float16"):
    m.verify(cfg, p, state, xbc, dt, [0, 0], backend="reference")
  assert state.ssm.dtype == jnp.int32 and not state.ssm.is_deleted()


def test_conversion_keeps_or_changes_the_state_dtype():
  snap = small_cfg()
  comp = snap.replace(replay_mode="compact")
  p = m.random_params(snap, 2)
  state = m.init_state(snap, 2, jnp.float32, state_dtype=jnp.bfloat16)
  xbc, dt = inputs(snap, 2, 8, rng=np.random.default_rng(2))
  _, state = m.verify(snap, p, state, xbc, dt, [0, 0], backend="reference")
  kept = m.convert_state(snap, p, state, [3, 5], comp, backend="reference")
  assert kept.ssm.dtype == jnp.bfloat16
  wide = m.convert_state(snap, p, state, [3, 5], comp, state_dtype=jnp.float32,
                         backend="reference")
  assert wide.ssm.dtype == jnp.float32
  assert_bitwise(kept.ssm.astype(jnp.float32), wide.ssm, "a 16-bit committed state widens exactly")

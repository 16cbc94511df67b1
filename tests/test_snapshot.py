"""Snapshot-mode kernels (interpret mode on CPU, compiled on a GPU) against the reference."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import dispatch, status
from tests.helpers import (matrix, assert_bitwise, assert_close, copy_state, inputs, np_rows,
                           random_state, ref_conv_prefill, ref_snapshot_call, small_cfg,
                           spec_error)


def call(cfg, p, state, xbc, dt, rows, backend, **kw):
  fn = m.verify if xbc.shape[1] <= cfg.capacity else m.prefill
  return fn(cfg, p, state, xbc, dt, rows, backend=backend, **kw)


@pytest.mark.parametrize("change,exc,match", [
    (dict(xbc=lambda x: x[..., :-1]), ValueError, r"xbc: expected shape \[2, 3, 96\], got \[2, 3, 95\]"),
    (dict(xbc=lambda x: x.astype(jnp.int32)), TypeError, "xbc: expected dtype"),
    (dict(dt=lambda d: d[:, :, :2]), ValueError, r"dt: expected shape \[2, 3, 4\]"),
    (dict(rows=lambda r: jnp.zeros((3,), jnp.int32)), ValueError, r"state_row: expected shape \[2\]"),
    (dict(rows=lambda r: jnp.zeros((2,), jnp.float32)), TypeError, "state_row: expected dtype int32"),
    (dict(z=lambda x: jnp.zeros((2, 3, 32), jnp.bfloat16)), TypeError, "z: expected dtype float32"),
])
def test_static_errors_name_the_argument(change, exc, match):
  cfg = small_cfg()
  p = m.random_params(cfg, 17)
  state = m.init_state(cfg, 2, jnp.float32)
  xbc, dt = inputs(cfg, 2, 3)
  args = dict(xbc=xbc, dt=dt, rows=jnp.zeros((2,), jnp.int32), z=None)
  for k, f in change.items():
    args[k] = f(args[k] if args[k] is not None else xbc)
  with pytest.raises(exc, match=match):
    m.verify(cfg, p, state, args["xbc"], args["dt"], args["rows"], z=args["z"],
             backend="reference")


def test_verify_checked_reports_an_entry_shared_by_two_sequences():
  """Device-side cache_indices are not checked on the host; two sequences on one entry are
  rejected on the device, and verify_checked reports them."""
  cfg = small_cfg()
  p = m.random_params(cfg, 20)
  state = m.init_state(cfg, 4, jnp.float32)
  xbc, dt = inputs(cfg, 3, 2)
  ci = jnp.asarray([2, 0, 2], jnp.int32)
  _, state, err = m.verify_checked(cfg, p, state, xbc, dt, jnp.zeros(3, jnp.int32),
                                   cache_indices=ci, backend="reference")
  with pytest.raises(Exception, match="sequence 0 addresses pool entry 2, which another sequence of the call "
                                    "addresses too"):
    err.throw()
  _, _, ok = m.verify_checked(cfg, p, state, xbc, dt, jnp.zeros(3, jnp.int32),
                              cache_indices=jnp.asarray([2, 0, 3], jnp.int32),
                              backend="reference")
  assert ok.get() is None


@pytest.mark.parametrize("mode,case,message", [
    ("snapshot", "entry", "cache_indices: sequence 1 addresses entry 7, outside the pool's 2 "
     "entries"),
    ("compact", "num_rows", r"num_rows: sequence 1 has num_rows=0, outside \[1, R=4\]"),
    ("compact", "state_row", "state_row rejected for sequence 1: state_row=2, but nothing is "
     "pending for its entry, so state_row must be 0"),
    ("snapshot", "state_row", "state_row rejected for sequence 1: state_row=9, allowed "
     "0 <= state_row < 8"),
])
def test_verify_checked_names_the_cause(mode, case, message):
  """Device-side bad input: verify_checked's error names the sequence and the cause, and the
  rejected sequence's entry is left as it was."""
  cfg = small_cfg(mode=mode)
  p = m.random_params(cfg, 22)
  xbc, dt = inputs(cfg, 2, 4)
  state = m.init_state(cfg, 2, jnp.float32)
  before = copy_state(state)
  i32 = lambda v: jnp.asarray(v, jnp.int32)
  kwargs = dict(entry=dict(cache_indices=i32([0, 7])), num_rows=dict(num_rows=i32([4, 0])),
                state_row=dict())[case]
  rows = i32([0, 9 if mode == "snapshot" else 2] if case == "state_row" else [0, 0])
  _, new, err = m.verify_checked(cfg, p, state, xbc, dt, rows, backend="reference", **kwargs)
  with pytest.raises(Exception, match=message):
    err.throw()
  if case != "entry":                       # entry 1 belongs to the rejected sequence
    for name, a, b in zip(new._fields, new, before):
      assert_bitwise(np.asarray(a)[1], np.asarray(b)[1], f"state.{name} of the rejected entry")


def test_a_second_call_of_the_same_shapes_traces_nothing():
  """In a fresh process, two verify calls of the same shapes trace and compile once: the
  setting that the first Pallas lowering adds to JAX's tracing context is registered at
  import."""
  code = textwrap.dedent("""
      import jax.numpy as jnp, numpy as np, m2v_jax as m
      from m2v_jax import dispatch
      cfg = m.Mamba2Config(nheads=4, headdim=8, dstate=16, ngroups=2)
      p, st = m.random_params(cfg, 0), m.init_state(cfg, 2, jnp.float32)
      xbc, dt = jnp.zeros((2, 4, cfg.conv_dim)), jnp.zeros((2, 4, 4))
      for _ in range(2):
        y, st = m.verify(cfg, p, st, xbc, dt, np.zeros(2, np.int32), backend="interpret")
      print(dispatch.call._cache_size())
      """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split()[-1] == "1", out.stdout + out.stderr


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_a_host_scalar_state_row_applies_to_every_sequence(mode):
  """verify_checked and invalid_sequences take a host scalar state_row (and num_rows) as
  verify does; B comes from cache_indices, else from the pool (E=3 here, 2 sequences)."""
  cfg = small_cfg(mode=mode)
  p = m.random_params(cfg, 21)
  xbc, dt = inputs(cfg, 2, 4)
  ci = jnp.asarray([2, 0], jnp.int32)
  fresh = lambda: m.init_state(cfg, 3, jnp.float32)      # verify donates the pool
  _, _, err = m.verify_checked(cfg, p, fresh(), xbc, dt, 0, cache_indices=ci, num_rows=3,
                               backend="reference")
  assert err.get() is None
  with pytest.raises(ValueError, match=r"state_row\[0\]=9"):
    m.verify_checked(cfg, p, fresh(), xbc, dt, 9, cache_indices=ci, backend="reference")
  np.testing.assert_array_equal(np.asarray(m.invalid_sequences(cfg, fresh(), 0, 4)),
                                [False, False, False])
  np.testing.assert_array_equal(
      np.asarray(m.invalid_sequences(cfg, fresh(), 9, 4, cache_indices=ci)), [True, True])
  np.testing.assert_array_equal(
      np.asarray(m.invalid_sequences(cfg, fresh(), 0, 4, cache_indices=ci, num_rows=5)),
      [True, True])
  with pytest.raises(ValueError, match="state_row: expected shape"):
    m.verify(cfg, p, fresh(), xbc, dt, jnp.int32(0), cache_indices=ci, backend="reference")
  with pytest.raises(ValueError, match=r"state_row: expected shape \[2\], got \[3\]"):
    m.invalid_sequences(cfg, fresh(), [0, 0, 0], 4, cache_indices=ci)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks a machine without a GPU")
def test_pallas_without_a_gpu_names_the_backends_that_work():
  cfg = small_cfg()
  p = m.random_params(cfg, 19)
  state = m.init_state(cfg, 2, jnp.float32)
  xbc, dt = inputs(cfg, 2, 3)
  with pytest.raises(ValueError, match=r"backend='pallas' .* no GPU .*backend='interpret'.*"
                                       r"backend='reference'"):
    m.verify(cfg, p, state, xbc, dt, [0, 0], backend="pallas")


def test_static_errors_capacity_state_and_pool():
  cfg = small_cfg()
  p = m.random_params(cfg, 18)
  xbc, dt = inputs(cfg, 2, 9)
  with pytest.raises(ValueError, match="a verify call takes at most capacity=8 rows, got R=9"):
    m.verify(cfg, p, m.init_state(cfg, 2, jnp.float32), xbc, dt, [0, 0])
  with pytest.raises(TypeError, match="expects SnapshotState, got CompactState"):
    m.verify(cfg, p, m.init_state(cfg.replace(replay_mode="compact"), 2, jnp.float32),
             xbc[:, :2], dt[:, :2], [0, 0])
  with pytest.raises(ValueError, match="cache_indices: required when the pool has 5 entries"):
    m.verify(cfg, p, m.init_state(cfg, 5, jnp.float32), xbc[:, :2], dt[:, :2], [0, 0])
  with pytest.raises(ValueError, match=r"state.conv has d_conv - 1 = 2 where this cfg has 3"):
    st = m.init_state(cfg, 2, jnp.float32)
    m.verify(cfg, p, st._replace(conv=st.conv[..., :2]), xbc[:, :2], dt[:, :2], [0, 0])
  with pytest.raises(ValueError, match=r"params.D: expected shape \[4\]"):
    m.verify(cfg, p._replace(D=jnp.zeros((5,))), m.init_state(cfg, 2, jnp.float32),
             xbc[:, :2], dt[:, :2], [0, 0])


def test_errors_name_the_cause():
  """A pool of another capacity or window, activations of another dtype than a compact pool's
  or than a snapshot pool's 16-bit conv state, float64 input: each message names the cause and
  what to do, and the pool is untouched."""
  cfg = small_cfg(capacity=4)
  comp = cfg.replace(replay_mode="compact")
  p = m.random_params(cfg, 17)
  xbc, dt = inputs(cfg, 2, 2)
  cases = [
      (cfg, m.init_state(cfg.replace(capacity=8), 2, jnp.float32), xbc, dt, ValueError,
       r"built for another config: state.ssm has capacity = 8 where this cfg has 4"),
      (comp.replace(window=16), m.init_state(comp, 2, jnp.float32), xbc, dt, ValueError,
       r"state.win_xb has window \+ capacity = 8 where this cfg has 20"),
      (comp, m.init_state(comp, 2, jnp.float32), xbc.astype(jnp.bfloat16),
       dt.astype(jnp.bfloat16), TypeError,
       r"the compact pool keeps float32 activations .* got bfloat16: cast xbc and dt"),
      (cfg, m.init_state(cfg, 2, jnp.bfloat16), xbc, dt, TypeError,
       r"state.conv: the pool keeps a bfloat16 conv state .* got float32 activations.*"
       r"init_state\(cfg, E, jnp.float32\)"),
      (cfg, m.init_state(cfg, 2, jnp.float32), np.asarray(xbc, np.float64), dt, TypeError,
       r"got float64 \(cast it, e.g. xbc.astype\(jnp.float32\)\)"),
  ]
  for c, st, x, d, err, msg in cases:
    before = copy_state(st)
    with pytest.raises(err, match=msg):
      m.verify(c, p, st, x, d, [0, 0], backend="reference")
    for name in type(st)._fields:
      assert_bitwise(getattr(st, name), getattr(before, name), name)


# One call of R rows against R one-row calls (SPEC: float32 rounding, 2e-6 relative).
ONE_ROW_BOUND = 2e-6


class SnapshotChecks:
  """Snapshot-mode kernels against the reference, bad rows, checked calls (compiled and
  interpret variants below)."""

  backend: str

  # Interpreted: R=1 at (S, G) = (8, 1), R=9 at (8, 2) and (16, 1), R=37 at (16, 2).
  @pytest.mark.parametrize("R,S,G", matrix(
      [(R, S, G) for R in (1, 5, 8, 9, 12, 37) for S in (8, 16) for G in (1, 2)],
      keep={0, 13, 14, 23}))
  def test_kernel_matches_reference(self, R, S, G):
    cfg = small_cfg(ngroups=G, capacity=S)
    p = m.random_params(cfg, R + S + G)
    rng = np.random.default_rng(R * 100 + S + G)
    B = 3
    state = random_state(cfg, B, rng=rng)
    # start slots that the call overwrites (0 and 2 when R > 2) and the last slot
    rows = np.array([2, S - 1, 0], np.int32)
    xbc, dt = inputs(cfg, B, R, rng=rng)
    before = copy_state(state)
    y_ref, want = ref_snapshot_call(
        cfg, p, m.SnapshotState(*map(jnp.asarray, before)), status.call_args(xbc, dt, rows))
    y, got = call(cfg, p, state, xbc, dt, rows, self.backend)
    assert_close(y, y_ref, 1e-5, "y")
    assert_close(got.ssm, want.ssm, 1e-5, "ssm bank")
    assert_bitwise(got.conv, want.conv, "conv bank")
    keep = min(R, S)
    assert_bitwise(np.asarray(got.ssm)[:, keep:], before.ssm[:, keep:], "slots >= R untouched")
    assert_bitwise(np.asarray(got.conv)[:, keep:], before.conv[:, keep:], "conv slots >= R")

  @pytest.mark.parametrize("dtype,conv_dtype", matrix([(jnp.bfloat16, None),
                                                       (jnp.bfloat16, jnp.float32),
                                                       (jnp.float16, None)], keep={0, 2}))
  def test_low_precision_activations(self, dtype, conv_dtype):
    cfg = small_cfg()
    p = m.random_params(cfg, 11)
    rng = np.random.default_rng(11)
    state = random_state(cfg, 2, dtype, rng=rng, conv_dtype=conv_dtype)
    xbc, dt, z = inputs(cfg, 2, 8, dtype, rng=rng, z=True)
    rows = np.array([3, 0], np.int32)
    y_ref, want = ref_snapshot_call(cfg, p, m.SnapshotState(*map(jnp.asarray, copy_state(state))),
                                          status.call_args(xbc, dt, rows, z))
    y, got = m.verify(cfg, p, state, xbc, dt, rows, z=z, backend=self.backend)
    assert y.dtype == dtype
    assert_close(y.astype(jnp.float32), y_ref.astype(jnp.float32), 1e-2, "y")
    assert_close(got.ssm, want.ssm, 1e-5, "ssm bank")
    assert_bitwise(got.conv, want.conv, "conv bank")

  def test_conv_launch_rounds_the_conv_output_to_the_activation_dtype(self):
    """The conv launch's post-conv rows are the reference conv's, rounded to bfloat16 (the
    causal conv's output dtype), and zero in the scratch rows past the call's."""
    from m2v_jax import dispatch
    from m2v_jax.kernels import verify_conv
    cfg = small_cfg(capacity=4)
    p = m.random_params(cfg, 22)
    state = random_state(cfg, 2, jnp.bfloat16, rng=np.random.default_rng(22))
    xbc, dt = inputs(cfg, 2, 4, jnp.bfloat16)
    plan = dispatch.plan(cfg, self.backend, state, 4, B=2, y_dtype=jnp.bfloat16)
    xr = verify_conv.conv(plan, p, state,
                          status.call_args(xbc, dt, jnp.zeros(2, jnp.int32)))["xr_ref"]
    assert xr.dtype == jnp.bfloat16 and xr.shape == (2, plan.KT, cfg.conv_dim)
    want, _ = ref_conv_prefill(cfg, p, state.conv[:, 0], xbc)
    assert_bitwise(xr[:, :4], want.astype(jnp.bfloat16), "post-conv rows")
    assert not np.any(np.asarray(xr[:, 4:], np.float32)), "rows past the call"

  def test_gate_and_dt_limit(self):
    cfg = small_cfg(dt_limit=(0.01, 0.3))
    p = m.random_params(cfg, 12)
    rng = np.random.default_rng(12)
    state = random_state(cfg, 2, rng=rng)
    xbc, dt, z = inputs(cfg, 2, 4, rng=rng, z=True)
    rows = np.array([1, 5], np.int32)
    y_ref, want = ref_snapshot_call(cfg, p, m.SnapshotState(*map(jnp.asarray, copy_state(state))),
                                          status.call_args(xbc, dt, rows, z))
    y, got = m.verify(cfg, p, state, xbc, dt, rows, z=z, backend=self.backend)
    assert_close(y, y_ref, 1e-5, "y")
    assert_close(got.ssm, want.ssm, 1e-5, "ssm")

  @pytest.mark.parametrize("mode,R,dstate", matrix(
      [(mode, R, d) for mode in ("snapshot", "compact") for R, d in ((8, 16), (5, 16), (8, 64))],
      keep={0, 4, 5}))
  def test_one_call_of_R_rows_equals_R_calls_of_one_row(self, mode, R, dstate):
    """y to float32 rounding (the dual form reads y of a call's rows from its start state);
    the states bitwise (they advance row by row in both). R=8 stores y as one tile, R=5 row
    by row; dstate=64 spans several state chunks."""
    cfg = small_cfg(mode=mode, dstate=dstate)
    p = m.random_params(cfg, 13)
    rng = np.random.default_rng(13)
    B = 2
    xbc, dt = inputs(cfg, B, R, rng=rng)
    start = random_state(small_cfg(dstate=dstate), B, rng=rng)
    ssm0, conv0 = start.ssm[:, 0], start.conv[:, 0]
    whole = m.state_from_committed(cfg, ssm0, conv0, jnp.float32)
    y_all, whole = m.verify(cfg, p, whole, xbc, dt, np.zeros(B, np.int32), backend=self.backend)
    last = np.full(B, R - 1, np.int32)
    want = m.committed_state(cfg, p, whole, last, backend=self.backend)

    single = m.state_from_committed(cfg, ssm0, conv0, jnp.float32)
    ys = []
    for t in range(R):
      y, single = m.verify(cfg, p, single, xbc[:, t:t + 1], dt[:, t:t + 1],
                           np.zeros(B, np.int32), backend=self.backend)
      ys.append(np.asarray(y))
    assert_close(np.concatenate(ys, axis=1), y_all, ONE_ROW_BOUND, "y")
    got = m.committed_state(cfg, p, single, np.zeros(B, np.int32), backend=self.backend)
    assert_bitwise(got[0], want[0], "ssm")
    assert_bitwise(got[1], want[1], "conv")

  @pytest.mark.parametrize("mode", ["snapshot", "compact"])
  def test_within_the_float32_bound_of_a_float64_recurrence(self, mode):
    """y of a verify call and the committed state after row 5 against the float64
    transcription of the recurrence: the 99.9th percentile of |error| / max |value| per
    sequence and head below 2e-6 (the contract's bound for the dual form)."""
    cfg = small_cfg(mode=mode, dstate=64)
    p = m.random_params(cfg, 23)
    rng = np.random.default_rng(23)
    start = random_state(small_cfg(dstate=64), 2, rng=rng)
    ssm0, conv0 = start.ssm[:, 0], start.conv[:, 0]
    xbc, dt = inputs(cfg, 2, 8, rng=rng)
    state = m.state_from_committed(cfg, ssm0, conv0, jnp.float32)
    y, state = m.verify(cfg, p, state, xbc, dt, np.zeros(2, np.int32), backend=self.backend)
    y64, s64, _ = np_rows(cfg, p, ssm0, conv0, xbc, dt)
    assert spec_error(y, y64, cfg) < 2e-6
    got = m.committed_state(cfg, p, state, np.full(2, 5, np.int32), backend=self.backend)[0]
    assert spec_error(got[:, None], s64[:, 5:6], cfg) < 2e-6

  def test_serial_prefill_body_segments_within_the_float32_bound(self):
    """A serial prefill of 133 rows, gated (its body of 125 rows: three 32-row segments and a
    partial one of 29, y of each in the dual form and the state folded in one product each):
    y and the state after the last row against the float64 recurrence within the contract's
    2e-6, and the modes bitwise."""
    R, B = 133, 2
    snap = small_cfg(dstate=32)
    p = m.random_params(snap, 29)
    rng = np.random.default_rng(29)
    start = random_state(snap, B, rng=rng)
    ssm0, conv0 = start.ssm[:, 0], start.conv[:, 0]
    xbc, dt, z = inputs(snap, B, R, rng=rng, z=True)
    y64, s64, _ = np_rows(snap, p, ssm0, conv0, xbc, dt, z)
    out = {}
    for mode in ("snapshot", "compact"):
      cfg = snap.replace(replay_mode=mode)
      state = m.state_from_committed(cfg, ssm0, conv0, jnp.float32)
      y, state = m.prefill(cfg, p, state, xbc, dt, np.zeros(B, np.int32), z=z, chunked=False,
                           backend=self.backend)
      assert spec_error(y, y64, cfg) < 2e-6, mode
      last = m.committed_state(cfg, p, state, np.full(B, 7, np.int32), backend=self.backend)
      assert spec_error(last[0][:, None], s64[:, R - 1:], cfg) < 2e-6, mode
      out[mode] = y, last
    assert_bitwise(out["snapshot"][0], out["compact"][0], "y across modes")
    assert_bitwise(out["snapshot"][1][0], out["compact"][1][0], "state across modes")

  @pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
  def test_state_of_several_tiles_matches_reference(self, mode):
    """dstate=64: the SSM kernel's state spans two 32-column chunks, whose products y sums;
    the kernels against the reference over verifies with partial acceptance."""
    cfg = small_cfg(mode=mode, dstate=64)
    p = m.random_params(cfg, 21)
    rng = np.random.default_rng(21)
    state, ref = m.init_state(cfg, 2, jnp.float32), m.init_state(cfg, 2, jnp.float32)
    for R, rows in ((8, [0, 0]), (8, [3, 6]), (5, [7, 2])):
      xbc, dt, z = inputs(cfg, 2, R, rng=rng, z=True)
      y, state = m.verify(cfg, p, state, xbc, dt, rows, z=z, backend=self.backend)
      y_ref, ref = m.verify(cfg, p, ref, xbc, dt, rows, z=z, backend="reference")
      assert_close(y, y_ref, 1e-5, f"y (R={R})")
    got = m.committed_state(cfg, p, state, [4, 1], backend=self.backend)
    want = m.committed_state(cfg, p, ref, [4, 1], backend="reference")
    assert_close(got[0], want[0], 1e-5, "committed ssm")

  def test_device_side_invalid_state_row(self):
    """Out-of-range rows known only on the device: entry untouched, y NaN, others unaffected."""
    cfg = small_cfg()
    p = m.random_params(cfg, 14)
    rng = np.random.default_rng(14)
    B = 4
    state = random_state(cfg, B, rng=rng)
    before = copy_state(state)
    xbc, dt = inputs(cfg, B, 5, rng=rng)
    rows = jnp.asarray([-1, 8, 3, 1000], jnp.int32)           # device array: no host check
    args = status.call_args(xbc, dt, jnp.asarray([0, 0, 3, 0], jnp.int32))
    y_ref, want = ref_snapshot_call(cfg, p, m.SnapshotState(*map(jnp.asarray, before)), args)
    y, got = m.verify(cfg, p, state, xbc, dt, rows, backend=self.backend)
    y = np.asarray(y)
    for b in (0, 1, 3):
      assert np.all(np.isnan(y[b])), f"sequence {b}: y must be NaN"
      assert_bitwise(np.asarray(got.ssm)[b], before.ssm[b], f"sequence {b} ssm untouched")
      assert_bitwise(np.asarray(got.conv)[b], before.conv[b], f"sequence {b} conv untouched")
    assert_close(y[2], np.asarray(y_ref)[2], 1e-5, "valid sequence y")
    assert_close(np.asarray(got.ssm)[2], np.asarray(want.ssm)[2], 1e-5, "valid sequence state")
    bad = m.invalid_sequences(cfg, got, rows, 5)
    assert np.asarray(bad).tolist() == [True, True, False, True]

  @pytest.mark.parametrize("rows,match", [
      ([0, 8], r"state_row\[1\]=8: expected 0 <= state_row < capacity=8"),
      ([-1, 0], r"state_row\[0\]=-1: expected 0 <= state_row < capacity=8"),
      ([0, 2 ** 32 + 3], r"state_row\[1\]=4294967299: expected an int32 value"),
  ])
  def test_host_invalid_state_row_raises_and_keeps_state(self, rows, match):
    cfg = small_cfg()
    p = m.random_params(cfg, 15)
    state = random_state(cfg, 2)
    before = copy_state(state)
    xbc, dt = inputs(cfg, 2, 3)
    with pytest.raises(ValueError, match=match):
      m.verify(cfg, p, state, xbc, dt, np.array(rows), backend=self.backend)
    for a, b in zip(state, before):          # not donated, not modified
      assert_bitwise(a, b, "state after a rejected call")

  def test_verify_checked_names_the_sequence(self):
    cfg = small_cfg()
    p = m.random_params(cfg, 16)
    state = random_state(cfg, 3)
    xbc, dt = inputs(cfg, 3, 2)
    rows = jnp.asarray([0, 1, 9], jnp.int32)
    y, state, err = m.verify_checked(cfg, p, state, xbc, dt, rows, backend=self.backend)
    assert np.all(np.isnan(np.asarray(y)[2])) and not np.any(np.isnan(np.asarray(y)[:2]))
    with pytest.raises(Exception, match="sequence 2: state_row=9"):
      err.throw()
    _, _, ok = m.verify_checked(cfg, p, state, xbc, dt, jnp.zeros(3, jnp.int32),
                                backend=self.backend)
    assert ok.get() is None


@pytest.mark.gpu
class TestSnapshotCompiled(SnapshotChecks):
  backend = "pallas"


class TestSnapshotInterpret(SnapshotChecks):
  backend = "interpret"


@pytest.mark.parametrize("fields,match", [
    (dict(n_cols=12), "n_cols: expected a power of two"),
    (dict(block_p=24), "block_p: expected a power of two"),
    (dict(num_warps=3), "num_warps: expected a power of two"),
    (dict(num_stages=0), "num_stages: expected >= 1")])
def test_tile_config_is_checked(fields, match):
  with pytest.raises(ValueError, match=match):
    m.TileConfig(**{"block_p": 16, "num_warps": 4, **fields})


def test_tile_config_from_text():
  """`block_p:num_warps:n_cols[:num_stages]`, then any field as `name=value`; anything else
  is a ValueError naming the form."""
  base = m.TileConfig(block_p=64, num_warps=4)
  t = base.replace_from_text("32:2:128:block_c=512:prep_warps=8")
  assert (t.block_p, t.num_warps, t.n_cols, t.num_stages, t.block_c, t.prep_warps) == (
      32, 2, 128, 1, 512, 8)
  assert base.replace_from_text("64:4:64:2").num_stages == 2
  for bad in ("64:4", "64:4:64:1:2", "64:4:64:width=2", "block_c=512:64:4:64",
              "64:4:64:block_p=32", "64:4:64:block_c=512:block_c=256", "64:4:64:block_c=x"):
    with pytest.raises(ValueError, match="expected block_p:num_warps:n_cols"):
      base.replace_from_text(bad)


def test_tile_table_keys_b1_apart():
  """Bolt at B=1 takes 32-row P tiles (the same n_cols, so the same bits) in compact mode and,
  in snapshot mode, for calls of more than capacity rows with 16-bit activations; every other
  batch, snapshot verify and float32 prefill the table's entry."""
  comp = m.BOLT.replace(replay_mode="compact")
  table = m.tile_config(m.BOLT)
  b1 = m.TileConfig(block_p=32, num_warps=4, n_cols=table.n_cols)
  assert m.tile_config(comp, 1) == m.tile_config(comp, 1, 8) == b1
  assert m.tile_config(comp, 2) == m.tile_config(comp) == m.tile_config(comp, 2, 37) == table
  assert m.tile_config(m.BOLT, 1) == m.tile_config(m.BOLT, 1, m.BOLT.capacity) == table
  assert m.tile_config(m.BOLT, 1, m.BOLT.capacity + 1, jnp.bfloat16) == b1
  assert m.tile_config(m.BOLT, 1, m.BOLT.capacity + 1, jnp.float32) == table
  assert m.tile_config(m.BOLT, 1, m.BOLT.capacity + 1) == table
  for cfg, R, dtype, block_p in [(comp, 8, jnp.bfloat16, 32), (m.BOLT, 8, jnp.bfloat16, 64),
                                 (m.BOLT, 37, jnp.bfloat16, 32), (m.BOLT, 37, jnp.float32, 64)]:
    plan = dispatch.plan(cfg, "pallas", m.init_state(cfg, 1, jnp.bfloat16), R, B=1,
                         y_dtype=dtype)
    assert plan.tiles.block_p == block_p, (cfg.replay_mode, R, dtype)


def test_pool_and_params_checks_are_cached_per_signature():
  """A call's shape and dtype checks of the pool and params run once per signature (they cost
  ~0.1 ms of host time a call otherwise); a bad pool still raises every time."""
  from m2v_jax import checks
  cfg = small_cfg()
  p = m.random_params(cfg, 3)
  state = m.init_state(cfg, 2, jnp.float32)
  xbc, dt = inputs(cfg, 2, 4)
  _, state = m.verify(cfg, p, state, xbc, dt, [0, 0], backend="reference")
  before = checks._checked_state.cache_info().hits, checks._checked_params.cache_info().hits
  _, state = m.verify(cfg, p, state, xbc, dt, [1, 1], backend="reference")
  after = checks._checked_state.cache_info().hits, checks._checked_params.cache_info().hits
  assert after == (before[0] + 1, before[1] + 1)
  small = m.init_state(cfg.replace(capacity=4), 2, jnp.float32)
  for _ in range(2):
    with pytest.raises(ValueError, match="the pool was built for another config"):
      m.verify(cfg, p, small, xbc, dt, [0, 0], backend="reference")

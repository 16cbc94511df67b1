"""The jax.numpy reference against an independent float64 NumPy transcription of one row
(docs/semantics.md) and of both modes' call semantics."""

import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import reference, status
from m2v_jax.kernels import rowmath
from tests.helpers import (matrix, assert_bitwise, assert_close, dev, inputs, np_rows, random_state,
                           ref_committed_state, ref_compact_call, ref_rows, ref_snapshot_call,
                           ref_ssd_chunked, small_cfg, spec_error)


def test_bf16_parts_are_exact_and_their_products_float32_accurate():
  """The compiled products' bf16 form, run by XLA on the CPU: three bfloat16 parts add up to
  every float32 in the documented range, and S.C^T and x^T.M through them are within 1e-6 of
  float64 where one bf16 pass is not."""
  import jax
  from m2v_jax.kernels import backend
  rng = np.random.default_rng(0)
  v = (rng.normal(size=200_000) * np.exp(rng.uniform(-60, 80, 200_000))).astype(np.float32)
  v = v[np.abs(v) >= 1e-31]
  parts = backend._bf16_parts(jnp.asarray(v))
  lo, mid, hi = (q.astype(jnp.float32) for q in parts)
  total = (hi + mid) + lo
  assert_bitwise(total, v, "three bf16 parts")
  assert np.all(np.abs(np.asarray(lo)) <= np.abs(np.asarray(mid)))      # smallest first
  assert np.all(np.abs(np.asarray(mid)) <= np.abs(np.asarray(hi)))
  # A state held in 16 bits drops the small parts (`_BF16_PARTS_UNUSED`): they must be +0.
  for held, unused in ((jnp.bfloat16, 2), (jnp.float16, 1)):
    w = jnp.asarray(v[np.abs(v) < 6e4]).astype(held).astype(jnp.float32)
    for q in backend._bf16_parts(w)[:unused]:
      assert not np.any(np.asarray(jax.lax.bitcast_convert_type(q, jnp.uint16))), held
  mm = backend.Products(exact_rows=True, tensor_cores=True, bf16_rows=True)
  bf = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32))
  s = rng.normal(size=(64, 128)).astype(np.float32)
  c = bf(rng.normal(size=(8, 128)))
  x, w = bf(rng.normal(size=(16, 64))), rng.normal(size=(16, 16)).astype(np.float32)
  err = lambda got, want: np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)
  want_sc = s.astype(np.float64) @ c.T.astype(np.float64)
  assert err(mm.state(jnp.asarray(s), jnp.asarray(c)), want_sc) < 1e-6
  assert err(mm.rows_t(jnp.asarray(x), jnp.asarray(w)), x.T.astype(np.float64) @ w) < 1e-6
  one = jax.lax.dot_general(jnp.asarray(s, jnp.bfloat16), jnp.asarray(c, jnp.bfloat16),
                            (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  assert err(one, want_sc) > 1e-4, "one bf16 pass is as accurate: the test cannot tell"


def test_random_params_take_a_key_or_a_seed():
  """A `jax.random` key or an int seed for it; values in the documented ranges."""
  import jax
  cfg = small_cfg()
  by_key, by_seed = m.random_params(cfg, jax.random.key(7)), m.random_params(cfg, 7)
  for a, b in zip(by_key, by_seed):
    assert_bitwise(a, b, "key vs seed")
  assert not np.array_equal(m.random_params(cfg, 8).A_log, by_seed.A_log)
  a = np.exp(np.asarray(by_seed.A_log))
  dt = np.log1p(np.exp(np.asarray(by_seed.dt_bias)))
  assert (a >= 1).all() and (a <= 16).all() and (dt >= 9e-4).all() and (dt <= 0.11).all()
  mixer = m.layer.random_mixer_params(m.MixerConfig(ssm=cfg, d_model=16), jax.random.key(7))
  assert mixer.in_proj.shape == (16, m.MixerConfig(ssm=cfg, d_model=16).d_in_proj)


@pytest.mark.parametrize("ngroups", [1, 2])
@pytest.mark.parametrize("use_z", [False, True])
def test_rows_match_float64_transcription(ngroups, use_z):
  cfg = small_cfg(ngroups=ngroups, dt_limit=(0.0, 0.5) if use_z else (0.0, float("inf")))
  p = m.random_params(cfg, 3)
  rng = np.random.default_rng(5)
  args = inputs(cfg, 2, 6, rng=rng, z=use_z)
  xbc, dt = args[:2]
  z = args[2] if use_z else None
  ssm0 = dev(rng.normal(size=(2, 4, 8, 16)), jnp.float32)
  conv0 = dev(rng.normal(size=(2, cfg.conv_dim, 3)), jnp.float32)
  y, s, c = ref_rows(cfg, p, ssm0, conv0, xbc, dt, z, keep=6)
  y64, s64, c64 = np_rows(cfg, p, ssm0, conv0, xbc, dt, z)
  assert_close(y, y64, 1e-5, "y")
  assert_close(s, s64, 1e-5, "states")
  assert_close(c, c64, 1e-7, "conv")


def test_conv_output_is_rounded_to_the_activation_dtype():
  """With bfloat16 activations the reference's conv output holds bfloat16 values, eagerly and
  under jit (where XLA may drop a float32 -> bfloat16 -> float32 round trip); with the same
  values as float32 activations it is not rounded."""
  import jax
  cfg = small_cfg()
  p = m.random_params(cfg, 6)
  rng = np.random.default_rng(6)
  xbc = dev(rng.normal(size=(2, 12, cfg.conv_dim)), jnp.bfloat16)
  conv0 = dev(rng.normal(size=(2, cfg.conv_dim, 3)), jnp.bfloat16)
  conv = lambda c, x: reference.conv_prefill(cfg, p, c, x)[0]
  for post in (conv(conv0, xbc), jax.jit(conv)(conv0, xbc)):
    assert_bitwise(post, post.astype(jnp.bfloat16).astype(jnp.float32), "bfloat16 values")
  wide = conv(conv0.astype(jnp.float32), xbc.astype(jnp.float32))
  assert np.count_nonzero(np.asarray(wide) != np.asarray(wide.astype(jnp.bfloat16), np.float32))


def test_softplus_threshold_and_large_dt():
  """dt + bias above 20 passes through unchanged (no softplus), below it is softplus'd."""
  raw = jnp.array([-30.0, 0.0, 19.5, 20.0, 20.5, 80.0], jnp.float32)
  out = np.asarray(rowmath.process_dt(raw, 0.0, (0.0, float("inf"))))
  want = np.where(np.asarray(raw) <= 20, np.log1p(np.exp(np.minimum(np.asarray(raw), 20.0))), raw)
  np.testing.assert_allclose(out, want, rtol=1e-6)
  assert out[4] == 20.5 and out[5] == 80.0


@pytest.mark.parametrize("R,S", matrix([(3, 8), (8, 8), (12, 8), (37, 16)], keep={1, 3}))
def test_snapshot_slots(R, S):
  """R <= S: slot r = after row r, slots >= R untouched; R > S: slot s = after row R-S+s."""
  cfg = small_cfg(capacity=S)
  p = m.random_params(cfg, 1)
  rng = np.random.default_rng(R)
  B = 2
  state = random_state(cfg, B, rng=rng)
  rows = np.array([S - 1, 0], np.int32)
  xbc, dt = inputs(cfg, B, R, rng=rng)
  before = [np.asarray(a) for a in state]
  y, new = ref_snapshot_call(cfg, p, state, status.call_args(xbc, dt, rows))
  y64, s64, c64 = np_rows(cfg, p, before[0][np.arange(B), rows], before[1][np.arange(B), rows],
                          xbc, dt)
  assert_close(y, y64, 1e-5, "y")
  keep = min(R, S)
  assert_close(np.asarray(new.ssm)[:, :keep], s64[:, R - keep:], 1e-5, "slots")
  assert_close(np.asarray(new.conv)[:, :keep], c64[:, R - keep:], 1e-7, "conv slots")
  assert_bitwise(np.asarray(new.ssm)[:, keep:], before[0][:, keep:], "slots >= R")


@pytest.mark.parametrize("R,W", matrix([(5, 8), (8, 8), (37, 8), (20, 16)], keep={1, 2}))
def test_compact_matches_snapshot_bitwise(R, W):
  """Reference modes agree bitwise over calls with replay, prefill hand-off and verify."""
  snap = small_cfg(capacity=W)
  comp = snap.replace(replay_mode="compact")
  p = m.random_params(snap, 2)
  rng = np.random.default_rng(7)
  B = 3
  s = m.init_state(snap, B, jnp.float32)
  c = m.init_state(comp, B, jnp.float32)
  rows = jnp.zeros((B,), jnp.int32)
  for n in (R, 8, 3, R, 1):
    n = min(n, W) if n != R else R
    xbc, dt = inputs(snap, B, n, rng=rng)
    ys, s = ref_snapshot_call(snap, p, s, status.call_args(xbc, dt, rows))
    yc, c = ref_compact_call(comp, p, c, status.call_args(xbc, dt, rows))
    assert_bitwise(ys, yc, f"y R={n}")
    assert np.all(np.asarray(c.pending) == min(n, W))
    rows = dev(rng.integers(0, min(n, W), B), jnp.int32)
    fold = status.call_args(None, None, rows)
    for a, b in zip(ref_committed_state(snap, p, s, fold),
                    ref_committed_state(comp, p, c, fold)):
      assert_bitwise(a, b, f"committed R={n}")


def test_chunked_ssd_matches_serial():
  cfg = small_cfg(ngroups=2)
  p = m.random_params(cfg, 4)
  rng = np.random.default_rng(9)
  xbc, dt, z = inputs(cfg, 2, 45, rng=rng, z=True)
  ssm0 = dev(rng.normal(size=(2, 4, 8, 16)), jnp.float32)
  conv0 = dev(rng.normal(size=(2, cfg.conv_dim, 3)), jnp.float32)
  y, s, c = ref_rows(cfg, p, ssm0, conv0, xbc, dt, z, keep=1)
  for chunk in (8, 16, 64):
    yc, sc, cc = ref_ssd_chunked(cfg, p, ssm0, conv0, xbc, dt, z, chunk=chunk)
    assert_close(yc, y, 1e-5, f"y chunk={chunk}")
    assert_close(sc, s[:, 0], 1e-5, f"state chunk={chunk}")
    assert_bitwise(cc, c[:, 0], "conv")


@pytest.mark.parametrize("value,want", [("snapshot", "snapshot"), ("compact", "compact"),
                                        ("0", "snapshot"), ("1", "compact")])
def test_mode_option_accepts(value, want):
  assert m.parse_replay_mode(value) == want
  assert small_cfg(mode=value).replay_mode == want


@pytest.mark.parametrize("value", ["2", "Compact", "", 1, None, "replay", " 1"])
def test_mode_option_rejects(value):
  with pytest.raises(ValueError, match=r"replay_mode: expected one of \['0', '1', 'compact', 'snapshot'\]"):
    small_cfg(mode=value)


@pytest.mark.parametrize("kw,match", [
    (dict(ngroups=3), "ngroups: expected a divisor of nheads=4"),
    (dict(capacity=0), "capacity: expected a positive int"),
    (dict(dt_limit=(1.0, 0.5)), "dt_limit"),
])
def test_config_rejects(kw, match):
  with pytest.raises(ValueError, match=match):
    small_cfg(**kw)


@pytest.mark.parametrize("R,capacity", [(1, 8), (5, 8), (8, 8), (13, 8), (20, 8), (6, 4)])
def test_dual_form_calls_match_the_float64_recurrence(R, capacity):
  """The reference's calls (y of each segment in the SSD dual form, states row by row)
  against the float64 transcription, by the contract's measure: the 99.9th percentile of
  |error| / max |value| per sequence and head below 2e-6, for y and the slots' states."""
  cfg = small_cfg(capacity=capacity)
  p = m.random_params(cfg, 30)
  state = random_state(cfg, 3, rng=np.random.default_rng(30))
  xbc, dt = inputs(cfg, 3, R, rng=np.random.default_rng(31))
  rows = jnp.asarray([0, 1, capacity - 1], jnp.int32)
  y, new = ref_snapshot_call(cfg, p, state, status.call_args(xbc, dt, rows))
  b = np.arange(3)
  y64, s64, _ = np_rows(cfg, p, state.ssm[b, rows], state.conv[b, rows], xbc, dt)
  keep = min(R, capacity)
  assert spec_error(y, y64, cfg) < 2e-6
  assert spec_error(new.ssm[:, :keep], s64[:, R - keep:], cfg) < 2e-6


def test_mixer_projections_round_once_in_the_activation_dtype():
  """bfloat16 weights and activations: in_proj's and out_proj's products come back in
  bfloat16, each float32 sum rounded once (the float32 product cast to bfloat16); the
  float32 partial output of `mixer_partial` (a head shard's) rounds to the same out."""
  import jax
  cfg = m.MixerConfig(ssm=small_cfg(), d_model=24)
  p = m.layer.random_mixer_params(cfg, 3, weight_dtype=jnp.bfloat16)
  rng = np.random.default_rng(3)
  a = dev(rng.normal(size=(2, 5, 24)), jnp.bfloat16)
  got = m.layer.project(a, p.in_proj, jnp.bfloat16)
  want = jnp.dot(a.astype(jnp.float32), p.in_proj.astype(jnp.float32),
                 precision=jax.lax.Precision.HIGHEST)
  assert got.dtype == jnp.bfloat16
  assert_bitwise(got, want.astype(jnp.bfloat16), "in_proj")
  state = m.init_state(cfg.ssm, 2, jnp.float32)
  out, _ = m.mixer(cfg, p, state, a, [0, 0], backend="reference")
  partial, _ = m.layer.mixer_partial(cfg, p, m.init_state(cfg.ssm, 2, jnp.float32), a, [0, 0],
                                     backend="reference")
  assert out.dtype == jnp.bfloat16 and partial.dtype == jnp.float32
  assert_bitwise(out, partial.astype(jnp.bfloat16), "out_proj")
  jaxpr = jax.make_jaxpr(lambda s, h: m.mixer(cfg, p, s, h, [0, 0], backend="reference"))(
      m.init_state(cfg.ssm, 2, jnp.float32), a)
  outs = [e.outvars[0].aval for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"
          and e.invars[1].aval.shape in (p.in_proj.shape, p.out_proj.shape)]
  assert [(o.shape[-1], o.dtype) for o in outs] == [(cfg.d_in_proj, jnp.bfloat16),
                                                     (24, jnp.bfloat16)], outs

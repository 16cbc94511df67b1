"""GPU-only checks: compiled kernels at Nemotron-3.5-Bolt geometry, the rounding canary,
in-place updates. Skipped on machines without a CUDA GPU (run by tools/run_gpu.sh)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import status
from m2v_jax.kernels import backend, rowmath
from tests.helpers import (assert_bitwise, assert_close, check_chunked_pool, check_nan_isolation,
                           check_reused_entry, check_sharded_mixer, check_sharded_verify,
                           copy_state, inputs, np_rows, Pair, PoolPair, PRECISION_BOUND,
                           random_state, ref_snapshot_call, SHARDED_VARIANTS, spec_error)

pytestmark = pytest.mark.gpu
BOLT = m.BOLT


def fma_f32(a, b, c):
  """Correctly rounded float32 a * b + c (one rounding, ties to even), computed exactly."""
  from fractions import Fraction
  out = np.empty(a.shape, np.float32)
  for i, (x, y, z) in enumerate(zip(a.ravel(), b.ravel(), c.ravel())):
    exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
    near = np.float32(float(exact))
    cands = [near, np.nextafter(near, np.float32(-np.inf)), np.nextafter(near, np.float32(np.inf))]
    err = [abs(Fraction(float(v)) - exact) for v in cands]
    best = min(err)
    ties = [v for v, e in zip(cands, err) if e == best]
    out.flat[i] = min(ties, key=lambda v: int(np.asarray(v).view(np.uint32)) & 1)
  return out


def test_rounding_policy_canary():
  """The compiled state update is one fused multiply-add, st * dA + (dt x) * B with the
  product (dt x) * B rounded on its own, bitwise; the inputs separate it from the unfused
  expression."""
  rng = np.random.default_rng(0)
  st, b = (rng.normal(size=s).astype(np.float32) for s in ((64, 128), (128,)))
  dA, dtx = np.float32(rng.uniform(0.5, 1.0)), rng.normal(size=64).astype(np.float32)

  def kernel(*, st_ref, da_ref, dtx_ref, b_ref, o_ref):
    o_ref[...] = rowmath.state_update(st_ref[...], da_ref[0], dtx_ref[...][:, None],
                                      b_ref[...][None, :], backend.fma(False))

  out = backend.pallas_call(
      kernel, inputs=dict(st_ref=st, da_ref=jnp.asarray([dA]), dtx_ref=dtx, b_ref=b),
      outputs=dict(o_ref=jax.ShapeDtypeStruct((64, 128), jnp.float32)), grid=(1,),
      num_warps=4, num_stages=1, interpret=False, name="canary")["o_ref"]
  prod = dtx[:, None] * b[None, :]                          # float32, rounded on its own
  fused = fma_f32(st, np.broadcast_to(dA, st.shape), prod)
  unfused = st * dA + prod                                 # NumPy rounds each op
  assert np.count_nonzero(fused != unfused) > 0, "inputs do not separate the two policies"
  assert_bitwise(out, fused, "state update vs one fused multiply-add")


@pytest.mark.parametrize("act", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_products_canary(act):
  """The compiled dual-form products are float32-accurate (three bf16 parts with bfloat16
  activations, the TF32 head-and-tail split with float16 ones, 3-pass TF32 with float32
  ones): S . C^T of a Bolt head within 1e-6 of float64, where one TF32 pass of the same
  operands is off by more than 1e-5 (so the test would see a precision fall back to it)."""
  rng = np.random.default_rng(0)
  s = rng.normal(size=(64, 128)).astype(np.float32)
  c = rng.normal(size=(8, 128)).astype(act).astype(np.float32)
  want = s.astype(np.float64) @ c.astype(np.float64).T
  mm = backend.Products(exact_rows=act != jnp.float32, tensor_cores=True,
                        bf16_rows=act == jnp.bfloat16)

  def kernel(*, s_ref, c_ref, o_ref, t_ref):
    o_ref[...] = mm.state(s_ref[...], c_ref[...])
    t_ref[...] = jax.lax.dot_general(s_ref[...], c_ref[...], (((1,), (1,)), ((), ())),
                                     precision=jax.lax.DotAlgorithmPreset.TF32_TF32_F32,
                                     preferred_element_type=jnp.float32)

  sds = jax.ShapeDtypeStruct((64, 8), jnp.float32)
  out = backend.pallas_call(kernel, inputs=dict(s_ref=jnp.asarray(s), c_ref=jnp.asarray(c)),
                            outputs=dict(o_ref=sds, t_ref=sds), grid=(1,), num_warps=4,
                            num_stages=1, interpret=False, name="canary")
  err = lambda a: np.linalg.norm(np.asarray(a, np.float64) - want) / np.linalg.norm(want)
  assert err(out["t_ref"]) > 1e-5, "one TF32 pass is as accurate: the test cannot tell"
  assert err(out["o_ref"]) < 1e-6, f"products: relative error {err(out['o_ref']):.2e}"


@pytest.mark.parametrize("R", [1, 8, 37])
def test_bolt_snapshot_matches_reference(R):
  rng = np.random.default_rng(R)
  p = m.random_params(BOLT, R)
  state = random_state(BOLT, 2, rng=rng)
  rows = np.array([3, 7], np.int32)
  xbc, dt = inputs(BOLT, 2, R, rng=rng)
  y_ref, want = ref_snapshot_call(BOLT, p, m.SnapshotState(*map(jnp.asarray, copy_state(state))),
                                        status.call_args(xbc, dt, rows))
  fn = m.verify if R <= 8 else m.prefill
  y, got = fn(BOLT, p, state, xbc, dt, rows, backend="pallas")
  assert_close(y, y_ref, 1e-5, "y")
  assert_close(got.ssm, want.ssm, 1e-5, "ssm")
  assert_close(got.conv, want.conv, 1e-6, "conv")


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_bolt_within_the_float32_bound_of_a_float64_recurrence(mode):
  """Bolt geometry, float32 activations: y of a verify call from a random state and the
  committed state after row 5 against a float64 recurrence, by the contract's measure (99.9th
  percentile of |error| / max |value| per sequence and head below 2e-6)."""
  cfg = BOLT.replace(replay_mode=mode)
  p = m.random_params(cfg, 6)
  rng = np.random.default_rng(6)
  start = random_state(BOLT, 2, rng=rng)
  ssm0, conv0 = start.ssm[:, 0], start.conv[:, 0]
  xbc, dt = inputs(cfg, 2, 8, rng=rng)
  state = m.state_from_committed(cfg, ssm0, conv0, jnp.float32)
  y, state = m.verify(cfg, p, state, xbc, dt, [0, 0], backend="pallas")
  y64, s64, _ = np_rows(cfg, p, ssm0, conv0, xbc, dt)
  assert spec_error(y, y64, cfg) < 2e-6
  got = m.committed_state(cfg, p, state, [5, 5], backend="pallas")[0]
  assert spec_error(got[:, None], s64[:, 5:6], cfg) < 2e-6


@pytest.mark.parametrize("B, dtype", [(1, jnp.bfloat16), (4, jnp.bfloat16), (1, jnp.float32)])
def test_bolt_compact_snapshot_bitwise(B, dtype):
  """At B=1 bf16 both modes' bodies run 32-row P tiles; float32 bodies run 32 (compact) and
  64 (snapshot), whose bits must agree all the same."""
  pair = Pair("pallas", B=B, seed=B, cfg=BOLT, dtype=dtype)
  pair.call(37)
  for rows in ([7] * B, [0] * B, [3] * B, None, None):
    pair.accept(pair.random_rows() if rows is None else rows)
    pair.call(8)
  pair.accept(pair.random_rows())
  pair.call(37)          # prefill while a window is pending (a 29-row body: serial)
  pair.accept([7] * B)
  pair.call(44)          # a 36-row body: serial, two segments of 32-row products
  pair.accept([2] * B)
  pair.call(1)
  pair.accept([0] * B)
  # a chunked prefill from a pending window (B=1: a 192-row body, 3 chunks; B=4: 392 rows,
  # past `dispatch.MIN_CHUNKED_ROWS_BF16_BATCHED`)
  pair.call(200 if B == 1 else 400)
  pair.accept(pair.random_rows())
  pair.call(8)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_bolt_one_call_equals_row_calls(mode):
  cfg = BOLT.replace(replay_mode=mode)
  p = m.random_params(cfg, 3)
  rng = np.random.default_rng(3)
  xbc, dt = inputs(cfg, 1, 8, jnp.bfloat16, rng=rng)
  start = random_state(BOLT, 1, rng=rng)
  mk = lambda: m.state_from_committed(cfg, start.ssm[:, 0], start.conv[:, 0].astype(jnp.bfloat16),
                                      jnp.bfloat16)
  y_all, whole = m.verify(cfg, p, mk(), xbc, dt, [0], backend="pallas")
  single, ys = mk(), []
  for t in range(8):
    y, single = m.verify(cfg, p, single, xbc[:, t:t + 1], dt[:, t:t + 1], [0], backend="pallas")
    ys.append(np.asarray(y))
  # y rounds to bfloat16 once: a float32 difference below 2e-6 flips a bit now and then.
  assert_close(np.concatenate(ys, 1).astype(np.float32), np.asarray(y_all, np.float32), 4e-3,
               "y")
  a = m.committed_state(cfg, p, whole, [7], backend="pallas")
  b = m.committed_state(cfg, p, single, [0], backend="pallas")
  assert_bitwise(a[0], b[0], "ssm: the states advance row by row in both")
  assert_bitwise(a[1], b[1], "conv")


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_bolt_invalid_rows_leave_state(mode):
  cfg = BOLT.replace(replay_mode=mode)
  p = m.random_params(cfg, 4)
  rng = np.random.default_rng(4)
  state = m.init_state(cfg, 3, jnp.bfloat16)
  xbc, dt = inputs(cfg, 3, 6, jnp.bfloat16, rng=rng)
  _, state = m.verify(cfg, p, state, xbc, dt, [0, 0, 0], backend="pallas")
  before = copy_state(state)
  rows = jnp.asarray([-5, 5, 2 ** 30], jnp.int32)        # valid only for sequence 1
  y, state = m.verify(cfg, p, state, xbc, dt, rows, backend="pallas")
  y = np.asarray(y.astype(jnp.float32))
  assert np.all(np.isnan(y[0])) and np.all(np.isnan(y[2])) and not np.any(np.isnan(y[1]))
  for name, a, b in zip(type(state)._fields, state, before):
    for s in (0, 2):
      assert_bitwise(np.asarray(a)[s], b[s], f"{name} of sequence {s}")


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_bolt_state_updated_in_place(mode):
  """Donated state: the compiled program has no copy and the output reuses the input buffer."""
  cfg = BOLT.replace(replay_mode=mode)
  p = m.random_params(cfg, 5)
  state = m.init_state(cfg, 2, jnp.bfloat16)
  xbc, dt = inputs(cfg, 2, 8, jnp.bfloat16)
  rows = jnp.zeros((2,), jnp.int32)
  step = jax.jit(lambda s: m.verify(cfg, p, s, xbc, dt, rows)[1], donate_argnums=0)
  hlo = step.lower(state).compile().as_text()
  copies = re.findall(r"= (\w+)\[([\d,]*)\]\{[^}]*\} copy(?:-start)?\(", hlo)
  sizes = [int(np.prod([int(d) for d in dims.split(",") if d])) for _, dims in copies]
  assert all(n < 1024 for n in sizes), f"a state leaf is copied: {copies}"
  ptrs = [leaf.unsafe_buffer_pointer() for leaf in state]
  state = step(state)
  assert [leaf.unsafe_buffer_pointer() for leaf in state] == ptrs


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
@pytest.mark.parametrize("R", [37, 512, 4096])
@pytest.mark.parametrize("dtype,precision", [(jnp.float32, None), (jnp.bfloat16, None),
                                             (jnp.bfloat16, "highest")])
def test_bolt_chunked_prefill_matches_reference(mode, R, dtype, precision):
  """The chunked scan at its default precision (and bfloat16 at "highest") against the
  serial recurrence (float32 math on the same inputs): float32 activations take 3-pass TF32
  products, within 1e-5 (one TF32 pass, the JAX default, would not be); bfloat16 ones take
  bf16 products, the final state within `PRECISION_BOUND["bf16"]`, or at "highest" three
  bf16 passes of each float32 operand, within 1e-5 (y is rounded to bfloat16 either way)."""
  cfg = BOLT.replace(replay_mode=mode, prefill_precision=precision)
  rng = np.random.default_rng(R)
  p = m.random_params(cfg, R)
  B = 2
  state = random_state(cfg, B, dtype, rng=rng)
  if mode == "compact":          # leave 8 rows pending: the pre-pass folds them
    x8, d8 = inputs(cfg, B, 8, dtype, rng=rng)
    _, state = m.verify(cfg, p, state, x8, d8, [0] * B, backend="reference")
  xbc, dt = inputs(cfg, B, R, dtype, rng=rng)
  rows = np.array([0, 5], np.int32)
  ref_state = type(state)(*map(jnp.asarray, copy_state(state)))
  y_ref, want = m.prefill(cfg, p, ref_state, xbc, dt, rows, backend="reference")
  y, got = m.prefill(cfg, p, state, xbc, dt, rows, backend="pallas", chunked=True)
  st_bound, y_bound = PRECISION_BOUND[cfg.prefill_precision_for(dtype)]
  assert_close(y.astype(jnp.float32), y_ref.astype(jnp.float32),
               y_bound if dtype == jnp.float32 else 1e-2, "y")
  assert_close(got.ssm, want.ssm, st_bound, "ssm")
  assert_close(got.conv, want.conv, 1e-6, "conv")


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_bolt_ragged_prefill(mode):
  """A ragged prefill at Bolt (bfloat16, bf16 products, gate on, a padding sequence, lengths
  4096, 300, 37 and 5) against the reference (one call per length)."""
  cfg = BOLT.replace(replay_mode=mode)
  rng = np.random.default_rng(41)
  p = m.random_params(cfg, 41)
  B, R, dtype = 5, 4096, jnp.bfloat16
  n = np.array([4096, 300, 37, 4096, 5], np.int32)
  idx = np.array([1, 4, 0, -1, 2], np.int32)
  state = random_state(cfg, 6, dtype, rng=rng)
  xbc, dt, z = inputs(cfg, B, R, dtype, rng=rng, z=True)
  rows = np.array([0, 3, 7, 0, 1] if mode == "snapshot" else [0] * B, np.int32)
  ref_state = type(state)(*map(jnp.asarray, copy_state(state)))
  y_ref, want = m.prefill(cfg, p, ref_state, xbc, dt, rows, z=z, cache_indices=idx,
                          num_rows=n, backend="reference")
  y, got = m.prefill(cfg, p, state, xbc, dt, rows, z=z, cache_indices=idx, num_rows=n,
                     backend="pallas")
  assert_close(y.astype(jnp.float32), y_ref.astype(jnp.float32), 1e-2, "y")
  assert not np.any(np.asarray(y[3], np.float32)), "padding sequence"
  assert_close(got.ssm, want.ssm, PRECISION_BOUND["bf16"][0], "ssm")
  assert_bitwise(got.conv, want.conv, "conv")


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
@pytest.mark.parametrize("R", [4000, 4096])
def test_bolt_chunked_pool_padding_invalid_and_nan(mode, R):
  """`test_prefill.check_chunked_pool` at Bolt (B=4 of a pool of 6, gate on): padding rows
  zero, a rejected sequence's rows NaN (written by the kernel: compiled outputs are not NaN
  by default), a NaN input kept in its sequence. R=4000: the padded body reaches past R."""
  check_chunked_pool("pallas", BOLT.replace(replay_mode=mode), R)


def test_bolt_pool_batch32():
  """Pool of 48 entries, batch 32 with padding, shuffled entries and mixed num_rows."""
  rng = np.random.default_rng(7)
  pp = PoolPair("pallas", seed=7, cfg=BOLT, num_entries=48, batch=32, dtype=jnp.bfloat16)
  idx = rng.permutation(48)[:32]
  idx[[3, 17]] = -1
  pp.call(idx=idx, rows=np.zeros(32), nrows=rng.integers(1, 9, 32))
  prev = dict(zip(idx.tolist(), pp.k["compact"].pending[np.maximum(idx, 0)].tolist()))
  idx2 = rng.permutation(idx)
  rows = [rng.integers(0, prev[e]) if e >= 0 else 0 for e in idx2.tolist()]
  pp.call(idx=idx2, rows=rows, nrows=rng.integers(1, 9, 32))


def test_bolt_pool_nan_isolation_batch32():
  """NaN/Inf inputs in one of 32 sequences (pool of 48, shuffled entries, mixed num_rows):
  every other sequence's y and state bitwise as without them, in both modes."""
  check_nan_isolation("pallas", cfg=BOLT, num_entries=48, batch=32, dtype=jnp.bfloat16)


def test_bolt_pool_reused_entry_batch32():
  """A reset pool entry at Bolt B=32 carries nothing over: bitwise a fresh pool's entry."""
  check_reused_entry("pallas", cfg=BOLT, num_entries=48, batch=32, dtype=jnp.bfloat16)


@pytest.mark.parametrize("mode,window,state_dtype", SHARDED_VARIANTS)
def test_bolt_two_gpu_head_sharding(mode, window, state_dtype):
  """Bolt heads split over 2 GPUs (64 heads and 4 groups each, in the TP channel layout)
  equal the one-GPU run, bitwise, over verifies (R = 8, 5, 8) with partial acceptance, a
  chunked prefill of 300 rows (body + serial tail) and a verify after it."""
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if len(gpus) < 2:
    pytest.skip(f"needs 2 GPUs, found {len(gpus)}")
  from jax.sharding import Mesh
  mesh = Mesh(np.array(gpus[:2]).reshape(1, 2), ("dp", "tp"))
  check_sharded_verify(BOLT.replace(replay_mode=mode, window=window), mesh, "pallas",
                       jnp.bfloat16, Bsz=2, seed=11, Rs=(8, 5, 8, 300, 8),
                       state_dtype=state_dtype, chunked=True)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_bolt_two_gpu_mixer_layer(mode):
  """The mixer layer at Bolt geometry (d_model 1024) with heads over 2 GPUs against one GPU,
  over verifies and a chunked prefill of 300 rows (float32 rounding: in_proj's columns and
  out_proj's sum are split across the GPUs)."""
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if len(gpus) < 2:
    pytest.skip(f"needs 2 GPUs, found {len(gpus)}")
  from jax.sharding import Mesh
  mesh = Mesh(np.array(gpus[:2]).reshape(1, 2), ("dp", "tp"))
  cfg = m.MixerConfig(ssm=BOLT.replace(replay_mode=mode), d_model=1024)
  check_sharded_mixer(cfg, mesh, "pallas", Bsz=2, seed=5, Rs=(8, 300, 5))

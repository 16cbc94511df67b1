"""Shared test helpers: small geometries, random inputs, bitwise and tolerance asserts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import m2v_jax as m


def small_cfg(ngroups=2, capacity=8, mode="snapshot", headdim=8, dstate=16,
              **kw) -> m.Mamba2Config:
  """A geometry small enough for interpret mode: H=4, P=8 (16 where the compiled chunked
  prefill must run: its dots are at least 16 wide), N=16 (64 where the SSM kernel's state
  must span several n_cols chunks), K=4."""
  return m.Mamba2Config(**{"nheads": 4, **kw}, headdim=headdim, dstate=dstate,
                        ngroups=ngroups, capacity=capacity, replay_mode=mode)


def inputs(cfg, B, R, dtype=jnp.float32, rng=None, z=False):
  """Random raw xBC [B, R, C], dt [B, R, H] (and z) in `dtype`."""
  rng = rng if rng is not None else np.random.default_rng(0)
  xbc = jnp.asarray(rng.normal(size=(B, R, cfg.conv_dim)), dtype)
  dt = jnp.asarray(rng.normal(-0.5, 1.5, size=(B, R, cfg.nheads)), dtype)
  if z:
    return xbc, dt, jnp.asarray(rng.normal(size=(B, R, cfg.d_inner)), dtype)
  return xbc, dt


def random_state(cfg, E, dtype=jnp.float32, rng=None, conv_dtype=None):
  """A state pool with random committed states in every snapshot slot / the compact base
  (nothing pending: the window and its bookkeeping zero)."""
  rng = rng if rng is not None else np.random.default_rng(1)
  shapes = m.state_shapes(cfg, E, dtype, conv_dtype)
  leaves = []
  for name, s in zip(type(shapes)._fields, shapes):
    if name in ("ssm", "conv"):
      leaves.append(jnp.asarray(rng.normal(size=s.shape), s.dtype))
    else:
      leaves.append(jnp.zeros(s.shape, s.dtype))
  return type(shapes)(*leaves)


def copy_state(state):
  """A host copy of every leaf (the op donates its input state)."""
  return type(state)(*(np.asarray(leaf).copy() for leaf in state))


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bitwise(a, b, what=""):
  a, b = np.asarray(a), np.asarray(b)
  assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
  diff = np.flatnonzero(bits(a) != bits(b))
  assert diff.size == 0, (f"{what}: {diff.size} of {a.size} elements differ, first at "
                          f"{np.unravel_index(diff[0], a.shape)}: {a.flat[diff[0]]} vs {b.flat[diff[0]]}")


def assert_states_close(got, want, rtol, what=""):
  """Two state pools (or any NamedTuples of arrays): float leaves within `rtol`
  (`assert_close`), integer leaves (pending, starts) bitwise."""
  for name, a, b in zip(type(got)._fields, got, want):
    if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating):
      assert_close(a, b, rtol, f"{what} {name}".strip())
    else:
      assert_bitwise(a, b, f"{what} {name}".strip())


def assert_close(a, b, rtol, what=""):
  """Relative error ||a - b|| / ||b|| below rtol, and no NaN in either."""
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  assert a.shape == b.shape, (what, a.shape, b.shape)
  assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), f"{what}: non-finite values"
  err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
  assert err < rtol, f"{what}: relative error {err:.3e} >= {rtol:.1e}"


def mark_16bit_float32_parity_gap(request, backend, state_dtype, act):
  """Compiled kernels with 16-bit state storage and float32 activations: the two modes give
  y that differ in a few elements by one float32 ulp (measured on the H200; deterministic,
  `tools/parity_probe.py`; cause open). Marks the test as an expected failure there (strict:
  a pass is reported), so the gap stays visible; bfloat16 activations must agree."""
  import pytest
  if (backend == "pallas" and jnp.dtype(state_dtype) != jnp.float32
      and jnp.dtype(act) == jnp.float32):
    request.applymarker(pytest.mark.xfail(
        strict=True, reason="16-bit state with float32 activations: compiled modes differ "
                            "by one ulp in a few y elements (open)"))


def np_rows(cfg, p, ssm0, conv0, xbc, dt, z=None):
  """One row (docs/semantics.md), row by row, in float64. Returns y [B,R,HP], states
  [B,R,H,P,N], convs [B,R,C,K-1]."""
  f = lambda a: np.asarray(a, np.float64)
  ssm, conv, xbc, dt = f(ssm0).copy(), f(conv0).copy(), f(xbc), f(dt)
  w, cb, dtb, alog, D = (f(a) for a in p)
  H, P, N, G = cfg.nheads, cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = H * P, G * N
  silu = lambda v: v / (1 + np.exp(-v))
  B, R, _ = xbc.shape
  ys, sts, cvs = np.zeros((B, R, HP)), np.zeros((B, R) + ssm.shape[1:]), np.zeros((B, R) + conv.shape[1:])
  for b in range(B):
    for t in range(R):
      win = np.concatenate([conv[b], xbc[b, t][:, None]], axis=1)
      post = silu((w * win).sum(1) + cb)
      conv[b] = win[:, 1:]
      x = post[:HP].reshape(H, P)
      Bm, Cm = post[HP:HP + GN].reshape(G, N), post[HP + GN:].reshape(G, N)
      d = dt[b, t] + dtb
      d = np.where(d <= 20, np.log1p(np.exp(np.minimum(d, 20))), d)
      d = np.clip(d, *cfg.dt_limit)
      dA = np.exp(d * -np.exp(alog))
      for h in range(H):
        g = h // (H // G)
        ssm[b, h] = ssm[b, h] * dA[h] + np.outer(d[h] * x[h], Bm[g])
        ys[b, t, h * P:(h + 1) * P] = ssm[b, h] @ Cm[g] + D[h] * x[h]
      if z is not None:
        ys[b, t] *= silu(f(z)[b, t])
      sts[b, t], cvs[b, t] = ssm[b], conv[b]
  return ys, sts, cvs


def spec_error(got, want, cfg):
  """The contract's measure of a float32 result against a float64 one: per sequence and head,
  the 99.9th percentile of |got - want| over max |want|; the largest over them. got, want:
  y [B, R, H*P] or states [B, rows, H, P, N]."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  B, H = want.shape[0], cfg.nheads
  if want.ndim == 3:                                      # y: heads on the last axis
    got, want = (a.reshape(B, a.shape[1], H, -1).swapaxes(1, 2) for a in (got, want))
  else:                                                   # states: heads on axis 2
    got, want = (a.swapaxes(1, 2) for a in (got, want))
  got, want = got.reshape(B, H, -1), want.reshape(B, H, -1)
  scale = np.max(np.abs(want), axis=-1)
  assert np.all(np.isfinite(got)) and np.all(scale > 0)
  return float(np.max(np.percentile(np.abs(got - want), 99.9, axis=-1) / scale))

import time, statistics, jax, jax.numpy as jnp, numpy as np
from jax import lax
from m2v_jax import config as C, params as P, prefill_kernels as pk, rowmath
f32 = jnp.float32
cfg = C.BOLT; p = P.random_params(cfg); K = cfg.d_conv
B, Rb, Rp = 1, 4088, 4096
rng = np.random.default_rng(0)
xbc = jnp.asarray(rng.normal(size=(B, Rb, cfg.conv_dim)), jnp.bfloat16)
dt = jnp.asarray(rng.normal(size=(B, Rb, cfg.nheads)), jnp.bfloat16)
conv0 = jnp.asarray(rng.normal(size=(B, cfg.conv_dim, K - 1)), jnp.bfloat16)
A = jax.jit(lambda c0, x, d: pk.body_inputs(cfg, p, c0, x, d, Rp))
def b_fn(c0, x, d):
  common = jnp.promote_types(c0.dtype, x.dtype)
  head = jnp.pad(jnp.swapaxes(c0, 1, 2).astype(common), [(0, 0), (0, Rp), (0, 0)])
  body = jnp.pad(x.astype(common), [(0, 0), (K - 1, Rp - Rb), (0, 0)])
  xp = jnp.where(lax.broadcasted_iota(jnp.int32, (1, K - 1 + Rp, 1), 1) < K - 1, head, body)
  window = [xp[:, k:k + Rp].astype(f32) for k in range(K)]
  taps = [p.conv_weight[:, k] for k in range(K)]
  post = rowmath.conv_output(taps, window, p.conv_bias)
  dtp = jnp.pad(rowmath.process_dt(d.astype(f32), p.dt_bias, cfg.dt_limit), [(0, 0), (0, Rp - Rb), (0, 0)])
  return post, dtp, jnp.swapaxes(xp[:, Rb:Rb + K - 1], 1, 2).astype(f32)
Bj = jax.jit(b_fn)
a, b = A(conv0, xbc, dt), Bj(conv0, xbc, dt)
print("rows<Rb equal:", bool(jnp.array_equal(a[0][:, :Rb], b[0][:, :Rb])), bool(jnp.array_equal(a[2], b[2])))
def t(f, n=50):
  f(conv0, xbc, dt)[0].block_until_ready(); t0 = time.perf_counter()
  for _ in range(n): r = f(conv0, xbc, dt)
  jax.block_until_ready(r); return (time.perf_counter() - t0) / n * 1e6
ta, tb = [], []
for _ in range(10):
  ta.append(t(A)); tb.append(t(Bj)); tb.append(t(Bj)); ta.append(t(A))
print(f"A (conv of body rows, then pad) median {statistics.median(ta):.1f} us; B (join by select, conv over padded) {statistics.median(tb):.1f} us")

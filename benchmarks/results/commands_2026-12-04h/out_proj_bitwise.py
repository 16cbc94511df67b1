"""Whether out_proj rounded to bf16 in the GEMM equals the float32 GEMM then a convert, at
Bolt's mixer (d_inner 8192 -> d_model 4096) for B x R rows, on this machine's default backend."""
import jax, jax.numpy as jnp, numpy as np
f32 = jnp.float32
rng = np.random.default_rng(0)
d, n = 8192, 4096                                    # out_proj: d_inner -> d_model
w = jnp.asarray(rng.normal(0, d ** -0.5, (d, n)), jnp.bfloat16)
for rows in (1, 2, 4, 8, 64, 256, 1024, 4096):
  a = jnp.asarray(rng.normal(size=(rows, d)), jnp.bfloat16)
  old = jax.jit(lambda a, w: jnp.dot(a, w, preferred_element_type=f32).astype(jnp.bfloat16))(a, w)
  new = jax.jit(lambda a, w: jnp.dot(a, w, preferred_element_type=jnp.bfloat16))(a, w)
  diff = int(np.sum(np.asarray(old.astype(f32)) != np.asarray(new.astype(f32))))
  o, q = np.asarray(old.astype(f32)), np.asarray(new.astype(f32))
  exact = np.asarray(jnp.dot(a.astype(f32), w.astype(f32), precision="highest"), np.float64)
  ulp = np.abs(o - q) / np.maximum(np.spacing(np.abs(o).astype(np.float32)) * 2 ** 16, 1e-30)
  err = lambda v: float(np.max(np.abs(v - exact)) / np.max(np.abs(exact)))
  print(f"rows {rows}: {diff} of {old.size} elements differ, at most {ulp.max():.0f} bf16 ulp;"
        f" max error / max |exact|: float32 GEMM + convert {err(o):.2e}, bf16 GEMM {err(q):.2e}",
        flush=True)

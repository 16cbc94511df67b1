"""Device smoke: run the Mosaic GPU y-product probe compiled, check against numpy."""
import sys, time
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import mosaic_gpu_probe as mp
print(jax.__version__, jax.devices())
for dt in (jnp.float32, jnp.bfloat16):
  k, args = mp.y_product(dtype=dt, heads=4)
  rng = np.random.default_rng(0)
  s = jnp.asarray(rng.normal(size=args[0].shape), dt); c = jnp.asarray(rng.normal(size=args[1].shape), dt)
  try:
    y = jax.jit(k)(s, c); y = np.asarray(y)
    ref = np.einsum("hpn,hrn->hpr", np.asarray(s, np.float64), np.asarray(c, np.float64))
    print(jnp.dtype(dt).name, "max rel err", np.abs(y - ref).max() / np.abs(ref).max())
  except Exception as e:
    print("FAILED", jnp.dtype(dt).name, type(e).__name__, str(e)[:2000])

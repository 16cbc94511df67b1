"""Times lower / compile / first run of a jitted step of N verify calls, Triton vs Mosaic tiles."""
import sys, time
import jax, jax.numpy as jnp, numpy as np
import m2v_jax as m
from m2v_jax import dispatch, status

def probe(mode, window, B, N, tiles_text):
  cfg = m.BOLT.replace(replay_mode=mode, window=window)
  R, dtype = 8, jnp.bfloat16
  rng = np.random.default_rng(0)
  params = m.random_params(cfg)
  state = m.init_state(cfg, B, dtype)
  xbc = jnp.asarray(rng.normal(size=(B, R, cfg.conv_dim)), dtype)
  dt = jnp.asarray(rng.normal(-1.0, 1.0, size=(B, R, cfg.nheads)), dtype)
  tiles = m.tile_config(cfg)
  if tiles_text:
    tiles = tiles.replace_from_text(tiles_text)
  ci, nr = jnp.arange(B, dtype=jnp.int32), jnp.full((B,), R, jnp.int32)
  def many(s, rows):
    ys = []
    for i in range(N):
      y, s = dispatch.kernel_call(cfg, "pallas", params, s,
                                  status.call_args(xbc, dt, rows[i], None, ci, nr), tiles)
      ys.append(y)
    return s, ys
  rows = jnp.asarray(np.arange(N * B).reshape(N, B) % R, jnp.int32)
  f = jax.jit(many, donate_argnums=0)
  t0 = time.perf_counter(); lo = f.lower(state, rows); t1 = time.perf_counter()
  co = lo.compile(); t2 = time.perf_counter()
  out = co(state, rows); jax.block_until_ready(out); t3 = time.perf_counter()
  out2 = co(out[0], rows); jax.block_until_ready(out2); t4 = time.perf_counter()
  print(f"{mode:8s} W={window} B={B} N={N} tiles={tiles_text or 'triton'}: lower {t1-t0:.1f} s, "
        f"compile {t2-t1:.1f} s, first run {t3-t2:.2f} s, second {1e3*(t4-t3):.2f} ms", flush=True)

for args in [("compact", None, 8, 4, "64:4:64:mosaic=1"), ("compact", 32, 8, 4, "64:4:64:mosaic=1"),
             ("snapshot", None, 8, 4, "64:4:64:mosaic=1")]:
  try:
    probe(*args)
  except Exception as e:
    print("FAILED", args, type(e).__name__, str(e)[:300], flush=True)

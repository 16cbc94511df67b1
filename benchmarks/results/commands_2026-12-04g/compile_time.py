"""Seconds to lower and to compile one Bolt verify call (B=32, R=8, bf16) and one chunked
prefill (B=1, R=4096) on the GPU, with Triton's dialect module registered (as `backend`
does) or, with --unregister, without it (the lookups fail again, as before 2026-12-04)."""
import sys, time
import jax, jax.numpy as jnp
import m2v_jax as m
from m2v_jax import dispatch
if "--unregister" in sys.argv:
  del sys.modules["jaxlib.mlir.dialects.tt"]
for mode in ("compact", "snapshot"):
  for B, R, chunked in ((32, 8, False), (1, 4096, True)):
    cfg = m.BOLT.replace(replay_mode=mode)
    args = dispatch.abstract_call_args(cfg, B, R, False, jnp.bfloat16, None)
    f = jax.jit(lambda p, s, a: dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=chunked,
                                              ragged=False), donate_argnums=(1,))
    t0 = time.perf_counter(); lo = f.trace(*args).lower(); t1 = time.perf_counter()
    lo.compile(); t2 = time.perf_counter()
    print(f"{mode} B={B} R={R} lower {t1 - t0:.2f} s compile {t2 - t1:.2f} s"
          f"{' unregistered' if '--unregister' in sys.argv else ''}", flush=True)

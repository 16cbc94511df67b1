"""The device's in-place copy rate over a Bolt state bank, by XLA and by Pallas (Triton lowering)
programs of the SSM kernel's tile shapes: python3 copy_rates.py [--batch=32] [--json=PATH].

Each variant reads and writes the float32 state [B, H, P, N] once per call, in place. A jitted
loop runs it `--iters` times; the median over `--reps` loops, divided by the iterations, is the
time of one pass. On the CPU (`--interpret`, small sizes) it only checks that the variants run.
"""
import argparse
import json
import statistics
import time
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--heads", type=int, default=128)
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--interpret", action="store_true")
ap.add_argument("--json", default=None)
args = ap.parse_args()
B, H, P, N = args.batch, args.heads, 64, 128
nbytes = 2 * B * H * P * N * 4


def pallas_copy(block_p, warps):
  def kernel(s_ref, o_ref):
    pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    ps = pl.ds(pid_p * block_p, block_p)
    o_ref[b, h, ps, :] = s_ref[b, h, ps, :] * 1.0000001

  call = pl.pallas_call(
      kernel, grid=(P // block_p, H, B),
      out_shape=jax.ShapeDtypeStruct((B, H, P, N), jnp.float32),
      input_output_aliases={0: 0}, interpret=args.interpret,
      compiler_params=plt.CompilerParams(num_warps=warps, num_stages=1),
      name=f"copy_p{block_p}_w{warps}")
  return call


def xla_scale(s):
  return s * 1.0000001


variants = {"xla": xla_scale}
for bp, w in [(64, 4), (64, 8), (32, 4), (32, 2), (16, 4), (16, 2), (8, 1)]:
  variants[f"pallas_p{bp}_w{w}"] = pallas_copy(bp, w)


def looped(f):
  @jax.jit
  def run(s):
    return lax.fori_loop(0, args.iters, lambda i, s: f(s), s)
  return run


results = {}
s = jnp.ones((B, H, P, N), jnp.float32)
with warnings.catch_warnings():
  warnings.simplefilter("ignore", DeprecationWarning)
  for name, f in variants.items():
    run = looped(f)
    s = run(s).block_until_ready()                     # compile and warm up
    times = []
    for _ in range(args.reps):
      t0 = time.perf_counter()
      s = run(s).block_until_ready()
      times.append((time.perf_counter() - t0) / args.iters)
    t = statistics.median(times)
    results[name] = dict(us=t * 1e6, gbps=nbytes / t / 1e9)
    print(f"{name:16s} {t * 1e6:9.2f} us  {nbytes / t / 1e9:8.1f} GB/s  "
          f"(min {min(times) * 1e6:.2f})", flush=True)
print(json.dumps(dict(batch=B, heads=H, bytes=nbytes, device=str(jax.devices()[0]),
                      results=results)))
if args.json:
  with open(args.json, "w") as fh:
    json.dump(dict(batch=B, heads=H, bytes=nbytes, device=str(jax.devices()[0]),
                   results=results), fh, indent=1)

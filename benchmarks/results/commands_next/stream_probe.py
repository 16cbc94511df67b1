"""Whether XLA runs a `compute_on("gpu_stream:1")` region beside the main stream's kernels.

Two independent Pallas kernels of 16 programs each (a few percent of the GPU, ~0.2 ms of
dependent multiply-adds): one after the other, then with the second inside the region.
Beside each other the pair takes about one kernel's time; serialized, two.

    python benchmarks/results/commands_next/stream_probe.py
"""

import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

from m2v_jax.kernels import backend

STEPS = 100000


def _spin(x_ref, o_ref):
  v = x_ref[...]
  o_ref[...] = lax.fori_loop(0, STEPS, lambda i, v: v * 0.999 + 0.001, v)


def spin(x):
  return backend.pallas_call(_spin,
                             inputs=dict(x_ref=x), outputs=dict(o_ref=jax.ShapeDtypeStruct(
                                 x.shape, x.dtype)), grid=(16,), num_warps=4, num_stages=1,
                             interpret=False, name="spin")["o_ref"]


def one_stream(a, b):
  return spin(a), spin(b)


def two_streams(a, b):
  from jax.experimental import compute_on
  side = compute_on.compute_on(spin, compute_type="gpu_stream:1",
                               out_memory_spaces=jax.memory.Space.Device)
  return spin(a), side(b)


def timed(f, *args):
  f = jax.jit(f)
  jax.block_until_ready(f(*args))
  out = []
  for _ in range(30):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    out.append((time.perf_counter() - t) * 1e6)
  return statistics.median(out)


def main():
  a = jnp.ones((128,), jnp.float32)
  b = jnp.ones((128,), jnp.float32) * 2
  single = timed(spin, a)
  for _ in range(2):
    print(f"one kernel {single:.1f} µs; pair on one stream {timed(one_stream, a, b):.1f} µs; "
          f"pair, the second in a compute_on region {timed(two_streams, a, b):.1f} µs")
  text = jax.jit(two_streams).lower(a, b).compile().as_text()
  print("\n".join(l.strip()[:150] for l in text.splitlines() if "async-" in l or "spin" in l
                  and "custom-call" in l))


if __name__ == "__main__":
  main()

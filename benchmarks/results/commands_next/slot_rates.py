"""The snapshot slot stream alone: each sequence's start state read once and written to S slots
(no fold, no y), by XLA and by Pallas programs of the SSM kernel's grid, against the device's
out-of-place copy rate: python3 slot_rates.py [--batch=32] [--slots=16] [--json=PATH].

The bank is [B, S, H, P, N] float32, updated in place; sequence b reads slot b % S and writes
every slot. A jitted loop runs a variant `--iters` times; the median over `--reps` loops,
divided by the iterations, is one pass. "floor" is the pass's bytes (one state read, S
written) at the copy rate, as the benchmark suites' floors. On the CPU (`--interpret`, small
sizes) it only checks that the variants run.
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
ap.add_argument("--slots", type=int, default=16)
ap.add_argument("--heads", type=int, default=128)
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--interpret", action="store_true")
ap.add_argument("--json", default=None)
args = ap.parse_args()
B, S, H, P, N = args.batch, args.slots, args.heads, 64, 128
state_bytes = H * P * N * 4
nbytes = B * (S + 1) * state_bytes
scales = 1.0 + 1e-7 * jnp.arange(1, S + 1, dtype=jnp.float32)


def pallas_slots(block_p, warps, evict, fill=False):
  def kernel(bank_ref, o_ref):
    pid_p, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    ps = pl.ds(pid_p * block_p, block_p)
    if fill:                                   # no state read: the write stream alone
      st = jnp.full((block_p, N), 1.0, jnp.float32) + b.astype(jnp.float32)
    else:
      st = bank_ref[b, b % S, h, ps, :]
    for s in range(S):
      st = st * (1.0 + 1e-7)
      if evict and not args.interpret:
        plt.store(o_ref.at[b, s, h, ps, :], st, eviction_policy="evict_first")
      else:
        o_ref[b, s, h, ps, :] = st

  return pl.pallas_call(
      kernel, grid=(P // block_p, H, B),
      out_shape=jax.ShapeDtypeStruct((B, S, H, P, N), jnp.float32),
      input_output_aliases={0: 0}, interpret=args.interpret,
      compiler_params=plt.CompilerParams(num_warps=warps, num_stages=1),
      name=f"slots_p{block_p}_w{warps}_e{int(evict)}_f{int(fill)}")


def xla_slots(bank):
  start = bank[jnp.arange(B), jnp.arange(B) % S]                    # [B, H, P, N]
  return start[:, None] * scales[None, :, None, None, None]


def xla_fill(bank):
  """The S slots written with a value from one element: the write stream alone."""
  return jnp.full(bank.shape, bank[0, 0, 0, 0, 0] * 1.0000001, bank.dtype)


variants = {"xla": xla_slots}
for bp, w, ev in [(64, 4, False), (64, 4, True), (64, 8, False), (32, 4, False)]:
  variants[f"pallas_p{bp}_w{w}" + ("_evict_first" if ev else "")] = pallas_slots(bp, w, ev)
# Write-only variants: their bytes are S/(S+1) of the pass's; "of floor" keeps the pass's floor.
variants["fill_xla"] = xla_fill
variants["fill_pallas_p64_w4"] = pallas_slots(64, 4, False, fill=True)


def looped(f):
  @jax.jit
  def run(bank):
    return lax.fori_loop(0, args.iters, lambda i, x: f(x), bank)
  return run


def copy_rate():
  """Out-of-place elementwise copy of 1 GiB (512 MiB on --interpret: 1 MiB), bytes read plus
  written over the time."""
  n = (1 << 18) if args.interpret else (1 << 28)
  x = jnp.ones((n,), jnp.float32)
  f = jax.jit(lambda x: x * 1.0000001)
  f(x).block_until_ready()
  times = []
  for _ in range(args.reps):
    t0 = time.perf_counter()
    for _ in range(args.iters):
      y = f(x)
    y.block_until_ready()
    times.append((time.perf_counter() - t0) / args.iters)
  return 2 * 4 * n / statistics.median(times)


results = {}
rate = copy_rate()
floor_us = nbytes / rate * 1e6
print(f"copy rate {rate / 1e9:.1f} GB/s; pass {nbytes / 1e9:.3f} GB; floor {floor_us:.2f} us")
bank = jnp.ones((B, S, H, P, N), jnp.float32)
with warnings.catch_warnings():
  warnings.simplefilter("ignore", DeprecationWarning)
  for name, f in variants.items():
    run = looped(f)
    bank = run(bank).block_until_ready()                 # compile and warm up
    times = []
    for _ in range(args.reps):
      t0 = time.perf_counter()
      bank = run(bank).block_until_ready()
      times.append((time.perf_counter() - t0) / args.iters)
    t = statistics.median(times)
    results[name] = dict(us=t * 1e6, gbps=nbytes / t / 1e9, of_floor=t * 1e6 / floor_us)
    print(f"{name:28s} {t * 1e6:9.2f} us  {nbytes / t / 1e9:8.1f} GB/s  "
          f"{t * 1e6 / floor_us:.3f}x floor  (min {min(times) * 1e6:.2f})", flush=True)
out = dict(batch=B, slots=S, heads=H, bytes=nbytes, copy_gbps=rate / 1e9, floor_us=floor_us,
           device=str(jax.devices()[0]), results=results)
print(json.dumps(out))
if args.json:
  with open(args.json, "w") as fh:
    json.dump(out, fh, indent=1)

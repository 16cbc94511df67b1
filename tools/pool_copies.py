"""Copies XLA adds around a jitted step of verify calls on a pool larger than the batch.

For each (mode, B, pool entries E): compiles a step of K calls on a donated pool and prints
the `copy` instructions of the optimized HLO (shapes), then the device time per call of each
kernel in a profiler trace.

    python3 tools/pool_copies.py --cases=compact:1:1,compact:1:16,compact:1:256
"""

import argparse
import collections
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

import m2v_jax as m

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench  # noqa: E402


def step_fn(cfg, params, K, backend):
  def step(state, xbc, dt, rows, idx):
    ys = []
    for k in range(K):
      y, state = m.verify(cfg, params, state, xbc, dt, rows[k], cache_indices=idx[k],
                          backend=backend)
      ys.append(y)
    return state, ys
  return jax.jit(step, donate_argnums=0)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--cases", default="compact:1:1,compact:1:16,snapshot:1:1,snapshot:1:16")
  ap.add_argument("--calls", type=int, default=16)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--backend", default="pallas")
  a = ap.parse_args()
  for case in a.cases.split(","):
    mode, B, E = case.split(":")
    B, E = int(B), int(E)
    cfg = m.BOLT.replace(replay_mode=mode)
    params = m.random_params(cfg, 0)
    xbc, dt = bench._inputs(cfg, B, 8, jnp.bfloat16)
    rows = tuple(jnp.zeros((B,), jnp.int32) for _ in range(a.calls))
    idx = tuple(jnp.asarray((np.arange(B) + k * B) % E, jnp.int32) for k in range(a.calls))
    fn = step_fn(cfg, params, a.calls, a.backend)
    state = m.init_state(cfg, E, jnp.bfloat16)
    text = fn.lower(state, xbc, dt, rows, idx).compile().as_text()
    copies = re.findall(r"= (\S+) copy(?:-start)?\(", text)
    print(f"== {mode} B={B} E={E}: {len(copies)} copies in the step of {a.calls} calls: "
          f"{collections.Counter(copies).most_common(8)}", flush=True)
    timed = bench.Case(case, lambda s, args: fn(s, *args)[0], state, a.calls,
                       args=(xbc, dt, rows, idx))
    total = bench.kernel_times(timed, a.steps)
    print(f"   device µs per call: {sum(total.values()):.2f}; " + ", ".join(
        f"{k[:40]} {v:.2f}" for k, v in list(total.items())[:6]), flush=True)


if __name__ == "__main__":
  main()

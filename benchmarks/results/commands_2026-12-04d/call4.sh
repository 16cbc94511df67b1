#!/bin/bash
# 2026-12-04 (session 21), call 4: the loop suite's B=1 compact case, pooled (16 one-entry
# slices of one pool) against 16 separate pools, kernel by kernel (call 3 found no copies).
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
PYTHONPATH=$PWD:$PWD/benchmarks XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 300 python3 - <<'PY' 2>&1 | grep -v "^WARNING\|^I0000\|^E0000" | tee $O/pooled_b1.txt
import jax.numpy as jnp
import bench
from m2v_jax import params as params_lib
for mode in ("compact", "snapshot"):
  cfg = bench._geom.replace(replay_mode=mode)
  params = params_lib.random_params(cfg)
  for rep in range(2):
    for pooled in (True, False):
      c = bench.loop_case(cfg, 1, 8, 16, jnp.bfloat16, params, seed=1, min_calls=128, pooled=pooled)
      t = bench.kernel_times(c, steps=3)
      print(mode, "pooled" if pooled else "separate", f"{sum(t.values()):.2f}",
            {k[:30]: round(v, 2) for k, v in t.items()}, flush=True)
PY
date -u

"""`fused_conv.patch` against the two launches, interpret mode: y, SSM and conv states bitwise.

    git worktree add /tmp/wf HEAD && cd /tmp/wf && patch -p1 < benchmarks/results/commands_next/fused_conv.patch
    PYTHONPATH=/tmp/wf python benchmarks/results/commands_next/fused_conv_check.py
"""
import dataclasses
import jax, jax.numpy as jnp, numpy as np
import m2v_jax as m
from m2v_jax import dispatch, status
from tests.helpers import small_cfg, inputs, random_state, assert_bitwise, copy_state

kern = jax.jit(dispatch.kernel_call, static_argnums=(0, 1, 5))
def run(capacity, R, gated, dtype, rows, num_rows, idx, E=6):
  cfg = small_cfg(capacity=capacity)
  p = m.random_params(cfg, 3)
  rng = np.random.default_rng(R)
  B = len(num_rows)
  xbc, dt = inputs(cfg, B, R, dtype, rng=rng)
  z = jnp.asarray(rng.normal(size=(B, R, cfg.d_inner)), dtype) if gated else None
  args = status.call_args(xbc, dt, np.asarray(rows, np.int32), z, np.asarray(idx, np.int32), np.asarray(num_rows))
  st = copy_state(random_state(cfg, E, dtype))
  tiles = m.tile_config(cfg, B)
  outs = []
  for fc in (0, 1):
    t = dataclasses.replace(tiles, fused_conv=fc)
    s0 = type(st)(*(jnp.asarray(a) for a in st))
    y, new = kern(cfg, "interpret", p, s0, args, t)
    outs.append((np.asarray(y), np.asarray(new.ssm), np.asarray(new.conv)))
  what = f"cap={capacity} R={R} gated={gated} {dtype.__name__ if hasattr(dtype,'__name__') else dtype}"
  for name, a, b in zip(("y", "ssm", "conv"), *outs):
    assert_bitwise(a, b, f"{name} {what}")
  print("ok", what)

for dtype in (jnp.float32, jnp.bfloat16):
  run(8, 20, True, dtype, [3, 0, 7], [20, 13, 9], [2, 0, 5])
  run(8, 8, False, dtype, [1, 5, 2], [8, 5, 3], [1, 4, -1])
  run(5, 45, True, dtype, [4, 2], [45, 30], [3, 1])
  run(8, 90, False, dtype, [0, 6], [90, 10], [0, 2])
  run(8, 10, True, dtype, [2, 9], [10, 10], [1, 3])   # state_row past capacity: rejected

#!/bin/bash
# Prepared 2026-12-04, not yet run: whether the verify kernels' y and states are bitwise the
# same at P tiles of 16 and 32 (2 warps) as at the table's 64:4:64, compiled, in both modes.
# If they are, the tile table may pick small P tiles at B=1 (measured 0.91x there in compact,
# 2026-12-01) without results depending on the batch size.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
date -u
timeout -k 5 240 python3 - <<'PY' 2>&1 | grep -v "^I1\|^W1" | tail -8 | tee $O/block_p_bitwise.log
import numpy as np, jax.numpy as jnp, m2v_jax as m
from m2v_jax import dispatch, status
for mode in ("compact", "snapshot"):
  cfg = m.BOLT.replace(replay_mode=mode)
  p, B = m.random_params(cfg), 3
  outs = {}
  for text in ("64:4:64", "32:2:64", "16:2:64"):
    t = m.tile_config(cfg).replace_from_text(text)
    st = m.init_state(cfg, B, jnp.bfloat16)
    r = np.random.default_rng(1)
    for k in range(5):
      x = jnp.asarray(r.normal(size=(B, 8, cfg.conv_dim)), jnp.bfloat16)
      d = jnp.asarray(r.normal(-1, 1, size=(B, 8, cfg.nheads)), jnp.bfloat16)
      rows = jnp.asarray(r.integers(0, 8, B) if k else np.zeros(B), jnp.int32)
      y, st = dispatch.kernel_call(cfg, "pallas", p, st, status.call_args(x, d, rows), t)
    outs[text] = [np.asarray(y)] + [np.asarray(l) for l in st]
  for text in ("32:2:64", "16:2:64"):
    same = [np.array_equal(a.view(np.uint8), b.view(np.uint8))
            for a, b in zip(outs["64:4:64"], outs[text])]
    print(f"{mode} {text} vs 64:4:64: y bitwise {same[0]}, state leaves bitwise {same[1:]}")
PY
date -u

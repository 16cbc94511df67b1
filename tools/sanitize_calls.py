"""The compiled kernels' calls that `compute-sanitizer` checks (tools/run_gpu.sh, stage
`sanitizer`): both modes, a pool of 6 entries for 4 sequences, with

- padding (a -1 entry), a device-side rejected `state_row`, an out-of-range entry;
- `num_rows` below R, and the gate z;
- a compact fold (`committed_state`), a serial prefill (R = 37) and chunked prefills (R = 200,
  whose padded body reaches past the call's rows) at Bolt's bf16 tiles, with chunk states and
  state passing as two kernels, fused (`ChunkTiles.fused_pass`), and the whole scan in one
  kernel (`ChunkTiles.fused_y`);
- packed prefills (`prefill_packed`) of three prompts, once with device offsets that reject
  one (an empty prompt).

    compute-sanitizer --tool initcheck --kernel-name kns=m2v python tools/sanitize_calls.py

`--geometry=bolt` (default) runs Bolt's layer (128 heads); `--geometry=small` runs 8 heads of
Bolt's head shape (the same tiles and kernels, 16x fewer programs), for the tools that
instrument every access (initcheck, racecheck) and take minutes on the full layer.

Each call's results are checked loosely (finite where valid, NaN where rejected) so that a
run that silently computed nothing fails here too.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import m2v_jax as m

GEOMETRIES = {"bolt": m.BOLT, "small": m.BOLT.replace(nheads=8, ngroups=2)}


# "deferred": compact mode with a 32-row window and a bfloat16 state (the window's offset
# stores, the fori_loop replay of 32 rows, the `starts` bitmask, the 16-bit stores).
MODES = {"snapshot": dict(replay_mode="snapshot"), "compact": dict(replay_mode="compact"),
         "deferred": dict(replay_mode="compact", window=32)}


def run(mode: str, geometry: str) -> None:
  cfg = GEOMETRIES[geometry].replace(**MODES[mode])
  rng = np.random.default_rng(0)
  p = m.random_params(cfg)
  E, B = 6, 4
  dtype = jnp.bfloat16
  state = m.init_state(cfg, E, dtype,
                       state_dtype=jnp.bfloat16 if mode == "deferred" else jnp.float32)
  inputs = lambda R: (jnp.asarray(rng.normal(size=(B, R, cfg.conv_dim)), dtype),
                      jnp.asarray(rng.normal(-1, 1, size=(B, R, cfg.nheads)), dtype),
                      jnp.asarray(rng.normal(size=(B, R, cfg.d_inner)), dtype))
  i32 = lambda v: jnp.asarray(v, jnp.int32)
  # 1. all valid, num_rows below R for two sequences, gate on
  xbc, dt, z = inputs(8)
  y, state = m.verify(cfg, p, state, xbc, dt, i32([0, 0, 0, 0]), z=z,
                      cache_indices=i32([0, 1, 2, 3]), num_rows=i32([8, 5, 1, 8]))
  assert np.all(np.isfinite(np.asarray(y, np.float32)))
  # 2. padding, a rejected state_row (sequence 2), an entry outside the pool (sequence 3)
  xbc, dt, z = inputs(8)
  y, state = m.verify(cfg, p, state, xbc, dt, i32([3, 0, 9, 0]), z=z,
                      cache_indices=i32([0, -1, 2, 17]))
  y = np.asarray(y, np.float32)
  assert np.all(np.isfinite(y[0])) and not np.any(y[1])
  assert np.all(np.isnan(y[2])) and np.all(np.isnan(y[3]))
  # 3. the committed state (a compact fold), then a serial and a chunked prefill with padding
  ssm, _ = m.committed_state(cfg, p, state, i32([2, 0]), cache_indices=i32([0, 4]))
  assert np.all(np.isfinite(np.asarray(ssm)))
  bolt = m.chunk_tile_config(m.BOLT, "bf16")     # Bolt's bf16 tiles, the three scan forms
  forms = [dataclasses.replace(bolt, fused_pass=p, fused_y=y) for p, y in ((0, 0), (1, 0), (1, 1))]
  for R, chunked, chunk_tiles in ((37, False, None), *((200, True, f) for f in forms)):
    xbc, dt, z = inputs(R)
    y, state = m.prefill(cfg, p, state, xbc, dt, i32([0, 0, 0, 0]), z=z,
                         cache_indices=i32([4, -1, 5, 1]), chunked=chunked,
                         chunk_tiles=chunk_tiles)
    y = np.asarray(y, np.float32)
    assert not np.any(y[1]) and np.all(np.isfinite(y[[0, 2, 3]])), (R, chunked)
  # 4. a packed prefill (prompts of 130, 1 and 37 rows, 8 rows of padding), then one whose
  # device offsets reject the second prompt (empty): its entry is left as it was
  T, cu = 176, (0, 130, 131, 168)
  xbc = jnp.asarray(rng.normal(size=(T, cfg.conv_dim)), dtype)
  dt = jnp.asarray(rng.normal(-1, 1, size=(T, cfg.nheads)), dtype)

  def packed(state, offsets, backend=None):   # y finite over the prompts, 0 past them
    y, state = m.prefill_packed(cfg, p, state, xbc, dt, offsets, cache_indices=i32([4, 5, 1]),
                                backend=backend)
    y = np.asarray(y, np.float32)
    assert np.all(np.isfinite(y[:cu[-1]])) and not np.any(y[cu[-1]:])
    return state

  state = packed(state, np.asarray(cu, np.int32))
  before = [np.asarray(leaf).copy() for leaf in (state.ssm, state.conv)]
  # Device offsets need the kernels: interpret mode where there is no GPU.
  state = packed(state, i32((0, 130, 130, 168)),
                 None if jax.default_backend() == "gpu" else "interpret")
  after = [np.asarray(leaf) for leaf in (state.ssm, state.conv)]
  for old, new in zip(before, after):
    assert np.array_equal(old[5], new[5], equal_nan=True), "rejected entry changed"
  # (the conv states of entries 4 and 1 repeat: the same last rows)
  assert not np.array_equal(before[0][4], after[0][4])
  assert not np.array_equal(before[0][1], after[0][1])
  print(f"{mode} ({geometry}): done")


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="bolt")
  parser.add_argument("--modes", default="snapshot,compact,deferred")
  args = parser.parse_args()
  for mode in args.modes.split(","):
    run(mode, args.geometry)

"""The Triton IR of every kernel of a fixed set of calls, lowered for an H200 on any machine.

Writes one `.ttir` file per (call, kernel) and `manifest.json` ({call/kernel: [sha256 of the
IR, num_warps, num_stages]}); with `--compare=OTHER/manifest.json` it lists the kernels whose
IR or launch parameters differ. A change meant to leave the kernels' arithmetic alone (a
refactor, a move) must leave the manifest unchanged:

    python tools/kernel_ir.py --out=/tmp/ir_before        # on the old commit
    python tools/kernel_ir.py --out=/tmp/ir_after --compare=/tmp/ir_before/manifest.json

Run the old commit from its own checkout with `PYTHONPATH=<that checkout>`: an editable
install of the package would otherwise import the current tree's.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import jax
import jax.numpy as jnp
from absl import app, flags

import m2v_jax as m
from m2v_jax import dispatch, status
from m2v_jax.kernels import backend

sds = jax.ShapeDtypeStruct


def calls():
  """(name, cfg, B, R, gate, dtype, chunked, pool entries) of every call lowered."""
  bolt = m.BOLT
  odd = m.Mamba2Config(nheads=80, headdim=64, dstate=128, ngroups=1)
  h96 = m.Mamba2Config(nheads=8, headdim=96, dstate=64, ngroups=2)
  for mode in ("snapshot", "compact"):
    for R, z in [(1, False), (8, False), (8, True), (5, False), (37, False)]:
      yield (f"bolt-{mode}-R{R}-z{int(z)}", bolt.replace(replay_mode=mode), 2, R, z,
             jnp.bfloat16, False, 2)
    yield f"odd-{mode}", odd.replace(replay_mode=mode), 3, 8, False, jnp.float32, False, 7
    for R, z in [(4096, False), (77, True)]:
      yield (f"bolt-{mode}-chunked-R{R}-z{int(z)}", bolt.replace(replay_mode=mode), 2, R, z,
             jnp.bfloat16, True, 2)
    yield (f"h96-{mode}-chunked", h96.replace(replay_mode=mode), 2, 136, False, jnp.bfloat16,
           True, 2)


def call_kernels(cfg, B, R, z, dtype, chunked, E):
  """{kernel name: (Triton IR, num_warps, num_stages)} of one verify/prefill call."""

  def f(p, s, a):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=chunked, ragged=False)

  return backend.triton_kernels(f, *dispatch.abstract_call_args(cfg, B, R, z, dtype, E), donate_argnums=(1,))


def fold_kernels():
  """The kernels of a compact `committed_state` (a fold)."""
  cfg = m.BOLT.replace(replay_mode="compact")
  f = lambda p, s, r: dispatch.committed(p, s, status.call_args(None, None, r), cfg=cfg,
                                         backend="pallas")
  return backend.triton_kernels(f, m.random_params(cfg), m.state_shapes(cfg, 2, jnp.bfloat16),
                                sds((2,), jnp.int32))


def manifest(out_dir=None) -> dict:
  out = {}
  groups = [(name, call_kernels(*rest)) for name, *rest in calls()]
  groups.append(("fold", fold_kernels()))
  for name, kernels in groups:
    for k, (ir, warps, stages) in kernels.items():
      out[f"{name}/{k}"] = [hashlib.sha256(ir.encode()).hexdigest()[:16], warps, stages]
      if out_dir:
        with open(os.path.join(out_dir, f"{name}.{k}.ttir"), "w") as fh:
          fh.write(ir)
  return out


FLAGS = flags.FLAGS
flags.DEFINE_string("out", "/tmp/m2v_kernel_ir", "output directory")
flags.DEFINE_string("compare", None, "a manifest.json to compare with")


def main(argv):
  del argv
  os.makedirs(FLAGS.out, exist_ok=True)
  got = manifest(FLAGS.out)
  with open(os.path.join(FLAGS.out, "manifest.json"), "w") as fh:
    json.dump(got, fh, indent=1, sort_keys=True)
  print(f"{len(got)} kernels -> {FLAGS.out}")
  if FLAGS.compare:
    with open(FLAGS.compare) as fh:
      want = json.load(fh)
    diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    for k in diff:
      print(f"differs: {k}: {want.get(k)} -> {got.get(k)}")
    print("identical" if not diff else f"{len(diff)} kernels differ")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
  app.run(main)

"""Offline probe: does Triton's pipeliner stage a head loop's state loads through shared memory?

Lowers a Pallas kernel whose programs each loop over 16 heads of [64, 128] float32 states, at
num_stages 1-3, compiles it with upstream Triton for sm_90 (`tools/sass.py`; `pip install
triton`, not a dependency) and counts the asynchronous copies (cp.async, LDGSTS) and the plain
global loads. `--dot` consumes each state in a tensor-core product; without it the state is
used elementwise only.

    PYTHONPATH=. python tools/pipeline_probe.py --dot
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from absl import app, flags
from jax import lax
from jax.experimental import pallas as pl

from m2v_jax.kernels import backend
from tools import sass

flags.DEFINE_bool("dot", False, "use each loaded state in a tensor-core product")
FLAGS = flags.FLAGS

HEADS, P, N, GROUPS = 16, 64, 128, 8


def _kernel(s_ref, c_ref, o_ref, y_ref, *, dot):
  """s_ref, o_ref [GROUPS * HEADS, P, N] f32; c_ref [GROUPS, N]; y_ref [GROUPS, P]."""
  g = pl.program_id(0)
  c = c_ref[g, :]

  def head(j, acc):
    h = g * HEADS + j
    s = s_ref[h, :, :] * 0.9 + 0.1
    o_ref[h, :, :] = s
    if dot:
      return acc + jnp.sum(jnp.dot(s, jnp.broadcast_to(c[:, None], (N, 16))), axis=1)
    return acc + jnp.sum(s * c[None, :], axis=1)

  y_ref[g, :] = lax.fori_loop(0, HEADS, head, jnp.zeros((P,), jnp.float32))


def _kernels(stages, dot):
  def f(s, c):
    return backend.pallas_call(
        lambda **refs: _kernel(**refs, dot=dot), inputs=dict(s_ref=s, c_ref=c),
        outputs=dict(o_ref=jax.ShapeDtypeStruct(s.shape, jnp.float32),
                     y_ref=jax.ShapeDtypeStruct((GROUPS, P), jnp.float32)),
        grid=(GROUPS,), num_warps=4, num_stages=stages, interpret=False,
        name=f"probe_stages{stages}")
  return backend.triton_kernels(f, jax.ShapeDtypeStruct((GROUPS * HEADS, P, N), jnp.float32),
                                jax.ShapeDtypeStruct((GROUPS, N), jnp.float32))


def main(argv):
  del argv
  for stages in (1, 2, 3):
    for name, (ir, warps, st) in _kernels(stages, FLAGS.dot).items():
      path = f"/tmp/{name}.ttir"
      with open(path, "w") as fh:
        fh.write(ir)
      _, ptx, listing, usage = sass.compile_sm90(path, warps, st)
      plain = len(re.findall(r"LDG\.", listing))
      print(f"{name} (dot={FLAGS.dot}): {usage}; cp.async in PTX: {ptx.count('cp.async')}, "
            f"LDGSTS: {listing.count('LDGSTS')}, plain LDG: {plain}")


if __name__ == "__main__":
  app.run(main)

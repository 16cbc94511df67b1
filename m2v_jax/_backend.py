"""The one module that touches `jax.experimental.pallas.triton` (plt).

JAX deprecated the Pallas Triton backend in 0.11.0 and will remove it; every `plt.*` use of the
library lives here, so that a port (Mosaic GPU, or jax-triton with official Triton) edits this
file only. Kernels call `pallas_call`, `barrier` and `dot` from here, nothing from plt.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

DEPRECATION_MESSAGE = "The Pallas Triton backend is deprecated"


def pallas_call(kernel, *, grid, out_shape, input_output_aliases, num_warps, num_stages,
                interpret, name):
  """`pl.pallas_call` on the Triton lowering with explicit compiler parameters.

  Every ref is a whole array (no BlockSpecs): the kernels index with `pl.ds` themselves,
  because the rows they touch depend on per-sequence data. The deprecation warning of the
  Triton backend is silenced here, once, rather than at every call site.
  """
  call = pl.pallas_call(
      kernel,
      grid=grid,
      out_shape=out_shape,
      input_output_aliases=input_output_aliases,
      compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name=name,
  )

  def run(*args):
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", category=DeprecationWarning, message=DEPRECATION_MESSAGE)
      return call(*args)

  return run


def barrier(interpret: bool) -> None:
  """Orders the global-memory reads and writes of one program's threads (`__syncthreads`).

  Needed where threads of a program read locations that other threads of the same program
  write next. Interpret mode runs a program as one sequential step and has no rule for it.
  """
  if not interpret:
    plt.debug_barrier()


def isolate(x, interpret: bool):
  """Keeps interpret mode from fusing `x`'s producer into its consumer (identity when compiled).

  XLA:CPU picks a reduction's summation order per fusion, so in interpret mode the y readout
  of two kernels that compute the same state could round differently depending on what it
  got fused with. An optimization barrier makes the readout its own fusion everywhere. The
  compiled Triton kernels need none (their order is fixed by tile shape and warps), and the
  Triton lowering has no rule for the barrier.
  """
  return lax.optimization_barrier(x) if interpret else x


# Precision of every dot in the chunked prefill kernel: 3-pass TF32 on the tensor cores gives
# about float32 accuracy (8e-6 max abs error on a [64,64]x[64,128] product on the H200, vs
# 1e-2 for the TF32 default). See BUILD.md, "Prefill precision".
DOT_PRECISION = lax.DotAlgorithmPreset.TF32_TF32_F32_X3


def precision(interpret: bool = False):
  """The matmul precision of the chunked scan, for dots inside kernels and XLA einsums
  around them: `DOT_PRECISION` compiled, float32 (HIGHEST) in interpret mode on XLA:CPU."""
  return lax.Precision.HIGHEST if interpret else DOT_PRECISION


def dot(a, b, *, trans_a: bool = False, trans_b: bool = False, interpret: bool = False):
  """float32 op(a) @ op(b) of 2-D tiles inside a kernel, with the library's explicit precision.

  Interpret mode runs the dot on XLA:CPU, which has no 3-pass TF32 algorithm; it uses
  float32 (HIGHEST) there, which is at least as accurate.
  """
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return lax.dot_general(a, b, dims, precision=precision(interpret),
                         preferred_element_type=jnp.float32)


def abstract_h200_mesh():
  """An abstract one-device H200 mesh, for lowering kernels to Triton on a machine with no GPU."""
  from jax.sharding import AbstractDevice, AbstractMesh
  return AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="NVIDIA H200", num_cores=None, platform="cuda"))


def lower_for_cuda(fn, *args, donate_argnums=()):
  """Lowers `jax.jit(fn)` for CUDA on any machine (Triton lowering included); returns text.

  Catches what interpret mode accepts but the Triton lowering rejects (non-power-of-two
  blocks, unsupported primitives). It does not run ptxas, so resource limits still need a GPU.
  """
  from jax.sharding import use_abstract_mesh
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=DEPRECATION_MESSAGE)
    with use_abstract_mesh(abstract_h200_mesh()):
      lowered = jax.jit(fn, donate_argnums=donate_argnums).trace(*args).lower(
          lowering_platforms=("cuda",))
  return lowered.as_text()


def triton_kernels(fn, *args, donate_argnums=()):
  """The Triton IR of every Pallas kernel in `jax.jit(fn)(*args)`, lowered for an H200.

  Returns {kernel name: (Triton IR text without debug info, num_warps, num_stages)}. Works on
  any machine (see `lower_for_cuda`); `m2v_jax.sass` compiles the IR offline to SASS.
  """
  import re
  from jax._src.pallas.triton import lowering
  irs = {}
  original = lowering.lower_jaxpr_to_triton_module

  def capture(*a, **k):
    result = original(*a, **k)
    op = result.module.operation
    name = str(op.attributes["sym_name"]).strip('"')
    if name in irs:
      raise ValueError(f"two kernels named {name}")
    irs[name] = op.get_asm(enable_debug_info=False)
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  try:
    text = lower_for_cuda(fn, *args, donate_argnums=donate_argnums)
  finally:
    lowering.lower_jaxpr_to_triton_module = original
  params = {m[1]: (int(m[3]), int(m[2])) for m in re.finditer(
      r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)}
  if set(params) != set(irs):
    raise ValueError(f"launch parameters not found for {sorted(set(irs) - set(params))}")
  return {name: (ir,) + params[name] for name, ir in irs.items()}

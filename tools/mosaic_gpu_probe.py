"""Lowers, on any machine, a Mosaic GPU kernel with the verify path's y product: per head,
yᵀ [P, R] = S [P, N] · Cᵀ [N, R] from shared memory (TMA copies into swizzled tiles, one
wgmma: TF32 for a float32 state, or bfloat16 parts), to check a Mosaic GPU port offline.

Needs JAX's CUDA plugin, which the project's environment must not have (its CPU suite would
try the CUDA backend), so run it from an environment of its own:

    python -m venv /tmp/mg && /tmp/mg/bin/pip install jax==0.12.0.1 jaxlib==0.12.0.1 \\
        jax-cuda13-plugin==0.12.0.1 jax-cuda13-pjrt==0.12.0.1
    JAX_PLATFORMS=cpu PYTHONPATH=. /tmp/mg/bin/python tools/mosaic_gpu_probe.py

Prints the size of the lowered module and whether it is a `mosaic_gpu_v2` custom call. The
PTX, registers and timing need a GPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import use_abstract_mesh

from m2v_jax.kernels import backend


def y_product(P=64, N=128, R=8, heads=4, dtype=jnp.float32):
  """The kernel: heads programs, each copying its S and C to shared memory and running one
  wgmma into a [P, R] float32 accumulator."""
  row_elems = 128 // jnp.dtype(dtype).itemsize          # 128-byte swizzled rows
  transforms = (plgpu.TilingTransform((8, row_elems)), plgpu.SwizzleTransform(128))

  def body(s_gmem, c_gmem, y_gmem, s_smem, c_smem, acc, bar):
    h = jax.lax.axis_index("h")
    plgpu.copy_gmem_to_smem(s_gmem.at[h], s_smem, bar.at[0])
    plgpu.copy_gmem_to_smem(c_gmem.at[h], c_smem, bar.at[1])
    plgpu.barrier_wait(bar.at[0])
    plgpu.barrier_wait(bar.at[1])
    plgpu.wgmma(acc, s_smem, c_smem.T)
    plgpu.wgmma_wait(0)
    y_gmem[h] = acc[...]

  kernel = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((heads, P, R), jnp.float32),
      scratch_types=[plgpu.SMEM((P, N), dtype, transforms=transforms),
                     plgpu.SMEM((R, N), dtype, transforms=transforms),
                     plgpu.ACC((P, R), jnp.float32), plgpu.Barrier(num_barriers=2)],
      grid=(heads,), grid_names=("h",))
  args = (jax.ShapeDtypeStruct((heads, P, N), dtype), jax.ShapeDtypeStruct((heads, R, N), dtype))
  return kernel, args


def main():
  for dtype in (jnp.float32, jnp.bfloat16):
    kernel, args = y_product(dtype=dtype)
    with use_abstract_mesh(backend.abstract_h200_mesh()):
      text = jax.jit(kernel).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    print(f"{jnp.dtype(dtype).name}: {len(text)} characters, "
          f"mosaic_gpu_v2 custom call: {'mosaic_gpu_v2' in text}")


if __name__ == "__main__":
  main()

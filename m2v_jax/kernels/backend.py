"""The one module that touches `jax.experimental.pallas.triton` (plt).

JAX deprecated the Pallas Triton backend in 0.11.0 and will remove it; every `plt.*` use of the
library lives here, so that a port (Mosaic GPU, or jax-triton with official Triton) edits this
file only. Kernels launch through `pallas_call` (refs by name, aliases by name) and call
`barrier`, `fma`, `Products` and `dot` from here, nothing from plt. The ahead-of-time lowering helpers
(`lower_for_cuda`, `triton_kernels`) let tests and tools see the Triton IR on any machine.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from m2v_jax.kernels import rowmath


DEPRECATION_MESSAGE = "The Pallas Triton backend is deprecated"


def pallas_call(kernel, *, inputs, outputs, aliases=None, grid, num_warps, num_stages,
                interpret, name):
  """Runs `kernel` as one `pl.pallas_call` on the Triton lowering, with refs passed by name.

  Every ref is a whole array (no BlockSpecs): the kernels index with `pl.ds` themselves,
  because the rows they touch depend on per-sequence data. The deprecation warning of the
  Triton backend is silenced here, once, rather than at every call site.

  Args:
    kernel: `kernel(**refs)`; it receives one keyword argument per array in `inputs` and per
      shape in `outputs` (a name whose value is None is left out, so the kernel's default
      for it applies).
    inputs: {name: array or None}, in the kernel's argument order.
    outputs: {name: jax.ShapeDtypeStruct or None}, in order, after the inputs.
    aliases: {input name: output name}: the output is written in place of the input
      (`input_output_aliases`, derived here from the names).
    grid, num_warps, num_stages, interpret, name: launch parameters (`name` names the
      kernel in profiles and in the Triton IR).

  Returns:
    {output name: array}.
  """
  ins = {k: v for k, v in inputs.items() if v is not None}
  outs = {k: v for k, v in outputs.items() if v is not None}
  names = list(ins) + list(outs)
  if len(set(names)) != len(names):
    raise ValueError(f"{name}: a ref name is used twice: {names}")
  in_index = {k: i for i, k in enumerate(ins)}
  out_index = {k: i for i, k in enumerate(outs)}
  call = pl.pallas_call(
      lambda *refs: kernel(**dict(zip(names, refs))),
      grid=grid,
      out_shape=tuple(outs.values()),
      input_output_aliases=_aliases(aliases or {}, in_index, out_index, name),
      compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name=name,
  )
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=DEPRECATION_MESSAGE)
    results = call(*ins.values())
  return dict(zip(outs, results))


def _aliases(aliases, in_index, out_index, name):
  """`input_output_aliases` from {input name: output name}; a pair whose input and output
  are both absent is skipped."""
  out = {}
  for i, o in aliases.items():
    if (i in in_index) != (o in out_index):
      raise ValueError(f"{name}: alias {i} -> {o} with only one side present")
    if i in in_index:
      out[in_index[i]] = out_index[o]
  return out


def barrier(interpret: bool) -> None:
  """Orders the global-memory reads and writes of one program's threads (`__syncthreads`).

  Needed where threads of a program read locations that other threads of the same program
  write next. Interpret mode runs a program as one sequential step and has no rule for it.
  """
  if not interpret:
    plt.debug_barrier()


def fma(interpret: bool):
  """The multiply-add of the kernels' state update: `fma(a, b, c) = a * b + c`.

  Compiled: one `fma.rn.f32` (a single rounding), by inline PTX, since the Triton lowering
  has no fused multiply-add and contracts nothing itself. Interpret mode: JAX has no fused
  multiply-add, so a * b + c with two roundings (`rowmath.unfused`), the same as the
  jax.numpy reference.
  """
  if interpret:
    return rowmath.unfused

  def fused(a, b, c):
    a, b, c = (jnp.asarray(v, jnp.float32) for v in (a, b, c))
    shape = jnp.broadcast_shapes(a.shape, b.shape, c.shape)
    a, b, c = (jnp.broadcast_to(v, shape) for v in (a, b, c))
    return plt.elementwise_inline_asm(
        "fma.rn.f32 $0, $1, $2, $3;", args=[a, b, c], constraints="=f,f,f,f", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(shape, jnp.float32)])[0]

  return fused


# The chunked prefill's products at each `Mamba2Config.prefill_precision`, compiled: 3-pass
# TF32 on the tensor cores gives about float32 accuracy (8e-6 max abs error on a
# [64,64]x[64,128] product on the H200, vs 1e-2 for one TF32 pass); "bf16" rounds the
# operands to bfloat16 and runs bf16 tensor-core products. Accumulation is float32 in all.
# See docs/design.md, "Prefill precision".
_ALGORITHMS = {"highest": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
               "tf32": lax.DotAlgorithmPreset.TF32_TF32_F32}


def _tf32_head(x):
  """x's leading 11 significant bits (sign, exponent, 10 mantissa bits), exact in TF32: the
  low 13 mantissa bits cleared."""
  u = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFE000)
  return lax.bitcast_convert_type(u, jnp.float32)


# The smallest contraction of a bf16 tensor-core product (mma k16); shorter ones run TF32.
BF16_MIN_K = 16


class Products:
  """The float32-accurate products of the verify kernels' dual form (`kernels.dual`), on 2-D
  tiles, float32 accumulation.

  Compiled, on the tensor cores, every operand of every pass is exact in the pass's input
  type, so no conversion the compiler picks can change a product. With bfloat16 activations
  and a contraction of at least BF16_MIN_K, the passes are bf16: x, B and C are exact, and a
  float32 operand is split into three bfloat16 parts (each the rounded remainder of the one
  before: 27 bits in all, so the split is exact). Otherwise TF32: x, B and C of float16 activations are exact; a float32 operand
  is split into a head (its leading 11 bits) and a middle part (the next 11), and the passes
  sum head and middle products (two passes, or three when both operands are float32, with
  float32 activations); what is dropped is below 2^-22 of each operand. Parts are summed
  small first. Without tensor cores (interpret mode, the jax.numpy reference): float32
  products by XLA (`Precision.HIGHEST`).

  Args:
    exact_rows: whether the activations are 16-bit (x, B and C exact in TF32).
    tensor_cores: compiled kernels (else XLA's float32 products).
    bf16_rows: whether the activations are bfloat16 (bf16 passes).
  """

  def __init__(self, exact_rows: bool, tensor_cores: bool, bf16_rows: bool = False):
    self.exact_rows, self.tensor_cores = exact_rows, tensor_cores
    self.bf16_rows = bf16_rows and tensor_cores

  def _dot(self, a, b, dims, split, acc):
    """acc + a . b with `dims` contracting dims; `split`: the operands that are float32
    ("a", "b"; with float32 activations the rows are float32 too). Each pass is added to the
    running sum as `sum + dot` (small parts first), which Triton folds into the
    tensor-core accumulator."""
    dn = (dims, ((), ()))
    add = lambda total, part: part if total is None else total + part
    if not self.tensor_cores:
      return add(acc, lax.dot_general(a, b, dn, precision=lax.Precision.HIGHEST,
                                      preferred_element_type=jnp.float32))
    if self.bf16_rows and a.shape[dims[0][0]] >= BF16_MIN_K:
      bf = lambda v: v.astype(jnp.bfloat16)
      one = lambda u, v: lax.dot_general(u, v, dn, preferred_element_type=jnp.float32)
      if "a" in split:
        parts = [(p, bf(b)) for p in _bf16_parts(a)]
      elif "b" in split:
        parts = [(bf(a), p) for p in _bf16_parts(b)]
      else:
        parts = [(bf(a), bf(b))]
      total = acc
      for u, v in parts:
        total = add(total, one(u, v))
      return total
    one = lambda u, v: lax.dot_general(u, v, dn, precision=lax.DotAlgorithmPreset.TF32_TF32_F32,
                                       preferred_element_type=jnp.float32)
    parts = lambda v, is_f32: _tf32_parts(v) if is_f32 else (v, None)
    a_hi, a_mid = parts(a, "a" in split or not self.exact_rows)
    b_hi, b_mid = parts(b, "b" in split or not self.exact_rows)
    total = acc
    if a_mid is not None:
      total = add(total, one(a_mid, b_hi))
    if b_mid is not None:
      total = add(total, one(a_hi, b_mid))
    return add(total, one(a_hi, b_hi))

  def rows_t(self, x, w, acc=None):
    """acc + x [K, M] (rows) transposed times w [K, N] float32: [M, N]."""
    return self._dot(x, w, ((0,), (0,)), "b", acc)

  def state(self, s, c, acc=None):
    """acc + s [M, N] float32 times c [T, N] (rows) transposed: [M, T]."""
    return self._dot(s, c, ((1,), (1,)), "a", acc)

  def exact(self, b, c, acc=None):
    """acc + b [K, N] times c [T, N] transposed, both rows: [K, T]."""
    return self._dot(b, c, ((1,), (1,)), "", acc)


def _bf16_parts(v):
  """Three bfloat16 parts of float32 v, smallest first: each part is the remainder of v less
  the parts after it, rounded to nearest; with 9 significant bits each (8 stored, the
  rounding's sign) they hold all of v's 24."""
  hi = v.astype(jnp.bfloat16)
  r1 = v - hi.astype(jnp.float32)
  mid = r1.astype(jnp.bfloat16)
  lo = (r1 - mid.astype(jnp.float32)).astype(jnp.bfloat16)
  return lo, mid, hi


def _tf32_parts(v):
  """(head, middle) of float32 v, both exact in TF32: the leading 11 significant bits and
  the next 11 (v - head - middle is below 2^-22 |v|)."""
  head = _tf32_head(v)
  return head, _tf32_head(v - head)


def round_tf32(x):
  """float32 x with its mantissa rounded to TF32's 10 bits (nearest, ties to even), NaN kept:
  interpret mode's stand-in for a TF32 pass's operands (the tensor cores may truncate the low
  bits instead; either way 10 bits remain). For tests of the "tf32" precision's error."""
  x = x.astype(jnp.float32)
  u = lax.bitcast_convert_type(x, jnp.uint32)
  u = (u + jnp.uint32(0xFFF) + ((u >> 13) & jnp.uint32(1))) & jnp.uint32(0xFFFFE000)
  return jnp.where(jnp.isnan(x), x, lax.bitcast_convert_type(u, jnp.float32))


def _operands(a, b, precision: str, interpret: bool):
  """(a, b, lax precision) of a product at `precision`: bf16 operands for "bf16"; float32
  operands with the TF32 algorithm compiled; in interpret mode (XLA:CPU has no TF32) float32
  at HIGHEST, the operands rounded to TF32 for "tf32" (so that CPU tests see its error)."""
  if precision == "bf16":
    return a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), None
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  if not interpret:
    return a, b, _ALGORITHMS[precision]
  if precision == "tf32":
    a, b = round_tf32(a), round_tf32(b)
  return a, b, lax.Precision.HIGHEST


def dot(a, b, *, precision: str, trans_a: bool = False, trans_b: bool = False,
        interpret: bool = False):
  """float32 op(a) @ op(b) of 2-D tiles inside a kernel, with products at `precision`
  ("highest", "tf32" or "bf16", see `_operands`) and float32 accumulation."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  a, b, prec = _operands(a, b, precision, interpret)
  return lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32)


def einsum(spec: str, a, b, *, precision: str, interpret: bool = False):
  """`jnp.einsum` of two operands in XLA (around the kernels), products at `precision` as
  `dot`, float32 out."""
  a, b, prec = _operands(a, b, precision, interpret)
  return jnp.einsum(spec, a, b, precision=prec, preferred_element_type=jnp.float32)


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
  any machine (see `lower_for_cuda`); `tools/sass.py` compiles the IR offline to SASS.
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

"""The one module that touches `jax.experimental.pallas.triton` (deprecated by JAX), so a port
edits only this file; also ahead-of-time lowering helpers for tests and tools.
"""

from __future__ import annotations

import sys
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from m2v_jax.kernels import rowmath

# The first Pallas lowering imports the fuser, whose import adds a setting to JAX's tracing
# context; imported here, before anything is traced, it leaves jitted calls traced once.
try:
  import jax.experimental.pallas.fuser  # noqa: F401
except ImportError:
  pass

# MLIR's Python bindings look up a dialect's module under their prefixes whenever they wrap an
# operation and cache only successes: registered under the first, Triton's ("tt") is found once.
try:
  import jaxlib.triton.dialect as _tt_dialect
  sys.modules.setdefault("jaxlib.mlir.dialects.tt", _tt_dialect)
except ImportError:
  pass


DEPRECATION_MESSAGE = "The Pallas Triton backend is deprecated"


def pallas_call(kernel, *, inputs, outputs, aliases=None, grid, num_warps, num_stages,
                interpret, name):
  """One `pl.pallas_call` on the Triton lowering with whole-array refs passed by name.

  Args:
    kernel: `kernel(**refs)`, one keyword per input and output (None entries left out).
    inputs: {name: array or None}.
    outputs: {name: jax.ShapeDtypeStruct or None}, after the inputs.
    aliases: {input name: output name}, written in place (`input_output_aliases`).
    grid, num_warps, num_stages, interpret, name: launch parameters.

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


def load(ref, mask, other=0.0):
  """`ref` (a `ref.at[...]` view) where `mask` (broadcast to its shape), else `other`."""
  return plt.load(ref, mask=jnp.broadcast_to(mask, ref.shape), other=other)


def store(ref, value, mask) -> None:
  """Stores `value` into the `ref.at[...]` view where `mask` (broadcast to its shape)."""
  plt.store(ref, value, mask=jnp.broadcast_to(mask, ref.shape))


def _aliases(aliases, in_index, out_index, name):
  """`input_output_aliases` from {input name: output name}, skipping pairs with both absent."""
  out = {}
  for i, o in aliases.items():
    if (i in in_index) != (o in out_index):
      raise ValueError(f"{name}: alias {i} -> {o} with only one side present")
    if i in in_index:
      out[in_index[i]] = out_index[o]
  return out


def barrier(interpret: bool) -> None:
  """`__syncthreads` where a program's threads read what others of it write next (compiled only)."""
  if not interpret:
    plt.debug_barrier()


def static_loop(n: int, body, interpret: bool) -> None:
  """`body(i)` for i < n: unrolled where compiled (static indices), a `fori_loop` interpreted,
  where an unrolled loop makes XLA:CPU compile each copy."""
  if interpret:
    lax.fori_loop(0, n, lambda i, c: (body(i), c)[1], 0)
  else:
    for i in range(n):
      body(i)


def fma(interpret: bool):
  """The state update's `fma(a, b, c) = a * b + c`: one `fma.rn.f32` by inline PTX compiled (the
  Triton lowering has no fused multiply-add), `rowmath.unfused` in interpret mode.
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


def _ptx_f32(asm: str):
  """v -> float32 `asm` of each element of v (`$1` in, `$0` out), one inline PTX sequence."""
  def fast(v):
    v = jnp.asarray(v, jnp.float32)
    return plt.elementwise_inline_asm(
        asm, args=[v], constraints="=f,f", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(v.shape, jnp.float32)])[0]

  return fast


def silu(interpret: bool, approx: bool):
  """silu for kernels: `rowmath.silu`, or compiled with `approx` one inline PTX sequence,
  v * rcp.approx(1 + ex2.approx(-v log2 e)) (within a few float32 ulps; for results stored in
  16 bits).
  """
  if interpret or not approx:
    return rowmath.silu
  return _ptx_f32("{ .reg .f32 t; mul.f32 t, $1, 0fBFB8AA3B; ex2.approx.ftz.f32 t, t; "
                  "add.f32 t, t, 0f3F800000; rcp.approx.ftz.f32 t, t; mul.f32 $0, $1, t; }")


def exp2(interpret: bool):
  """2^v: `jnp.exp2` interpreted, compiled PTX ex2.approx.ftz (2 ulp; results below 2^-126
  flush to 0; -inf gives 0)."""
  return jnp.exp2 if interpret else _ptx_f32("ex2.approx.ftz.f32 $0, $1;")


def log2(interpret: bool):
  """log2(v): `jnp.log2` interpreted, compiled PTX lg2.approx.ftz (0 gives -inf)."""
  return jnp.log2 if interpret else _ptx_f32("lg2.approx.ftz.f32 $0, $1;")


# Compiled dot algorithms of the chunked prefill's precisions (docs/design.md, "Prefill precision").
_ALGORITHMS = {"highest": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
               "tf32": lax.DotAlgorithmPreset.TF32_TF32_F32}


def _tf32_head(x):
  """x's leading 11 significant bits (low 13 mantissa bits cleared), exact in TF32."""
  u = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFE000)
  return lax.bitcast_convert_type(u, jnp.float32)


# The smallest bf16 tensor-core contraction (mma k16); shorter ones run TF32.
BF16_MIN_K = 16


class Products:
  """Float32-accurate 2-D products with float32 accumulation: the verify kernels'
  (`kernels.dual`), and the chunked prefill's at "highest" with 16-bit activations.

  Compiled, every pass's operands are exact in its input type: bf16 passes (bfloat16
  activations, contraction >= BF16_MIN_K) split a float32 operand into three bfloat16 parts
  (fewer for a state held in 16 bits); TF32 passes split it into head and middle
  (docs/design.md, "Rounding policy"). Without tensor cores: XLA float32 products (HIGHEST).

  Args:
    exact_rows: 16-bit activations (x, B and C exact in TF32).
    tensor_cores: compiled kernels.
    bf16_rows: bfloat16 activations (bf16 passes).
  """

  def __init__(self, exact_rows: bool, tensor_cores: bool, bf16_rows: bool = False):
    self.exact_rows, self.tensor_cores = exact_rows, tensor_cores
    self.bf16_rows = bf16_rows and tensor_cores

  def _dot(self, a, b, dims, split, acc, held=jnp.float32):
    """acc + a . b over `dims`; `split` names the float32 operands ("a", "b"), exact in `held`;
    parts summed small first as `sum + dot` (upstream Triton, offline, issues each pass with a
    zero accumulator and adds it on its own)."""
    dn = (dims, ((), ()))
    held = jnp.dtype(held)
    add = lambda total, part: part if total is None else total + part
    if not self.tensor_cores:
      return add(acc, lax.dot_general(a, b, dn, precision=lax.Precision.HIGHEST,
                                      preferred_element_type=jnp.float32))
    if self.bf16_rows and a.shape[dims[0][0]] >= BF16_MIN_K:
      bf = lambda v: v.astype(jnp.bfloat16)
      one = lambda u, v: lax.dot_general(u, v, dn, preferred_element_type=jnp.float32)
      if "a" in split:
        parts = [(p, bf(b)) for p in _bf16_parts(a)[_BF16_PARTS_UNUSED[held]:]]
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
    a_hi, a_mid = parts(a, held == jnp.float32 if "a" in split else not self.exact_rows)
    b_hi, b_mid = parts(b, "b" in split or not self.exact_rows)
    total = acc
    if a_mid is not None:
      total = add(total, one(a_mid, b_hi))
    if b_mid is not None:
      total = add(total, one(a_hi, b_mid))
    return add(total, one(a_hi, b_hi))

  def product(self, a, b, split, *, trans_a=False, trans_b=False, acc=None):
    """acc + op(a) op(b) of 2-D tiles (float32 arrays); `split` names the operands that hold
    float32 values ("a", "b" or ""), the others holding activation-dtype values."""
    return self._dot(a, b, ((0 if trans_a else 1,), (1 if trans_b else 0,)), split, acc)

  def rows_t(self, x, w, acc=None):
    """acc + x [K, M]ᵀ w [K, N] (w float32): [M, N]."""
    return self._dot(x, w, ((0,), (0,)), "b", acc)

  def state(self, s, c, acc=None, held=jnp.float32):
    """acc + s [M, N] (float32 holding `held` values) c [T, N]ᵀ: [M, T]."""
    return self._dot(s, c, ((1,), (1,)), "a", acc, held)

  def exact(self, b, c, acc=None):
    """acc + b [K, N] c [T, N]ᵀ, both rows: [K, T]."""
    return self._dot(b, c, ((1,), (1,)), "", acc)


# Of `_bf16_parts`' three, the small ones that are zero for values exact in a 16-bit type.
_BF16_PARTS_UNUSED = {jnp.dtype(jnp.float32): 0, jnp.dtype(jnp.float16): 1,
                      jnp.dtype(jnp.bfloat16): 2}


def _bf16_parts(v):
  """Three bfloat16 parts of float32 v, smallest first: each the upper 16 bits of v less the
  larger parts (truncation, so each remainder is exact and no conversion rounds): together
  they hold all of v's 24 significant bits for |v| >= 1e-31 (below, the smallest part loses
  bits to bf16's subnormals)."""
  u32 = jnp.uint32

  def top(w):                          # w's upper 16 bits, as bfloat16 and as float32
    u = lax.bitcast_convert_type(w, u32)
    return (lax.bitcast_convert_type((u >> 16).astype(jnp.uint16), jnp.bfloat16),
            lax.bitcast_convert_type(u & u32(0xFFFF0000), jnp.float32))

  hi, hi32 = top(v)
  rest = v - hi32
  mid, mid32 = top(rest)
  return top(rest - mid32)[0], mid, hi


def _tf32_parts(v):
  """(head, middle) of float32 v, both exact in TF32; the rest is below 2^-22 |v|."""
  head = _tf32_head(v)
  return head, _tf32_head(v - head)


def round_tf32(x):
  """float32 x rounded to TF32's 10 mantissa bits (ties to even, NaN kept): interpret mode's
  stand-in for TF32 operands.
  """
  x = x.astype(jnp.float32)
  u = lax.bitcast_convert_type(x, jnp.uint32)
  u = (u + jnp.uint32(0xFFF) + ((u >> 13) & jnp.uint32(1))) & jnp.uint32(0xFFFFE000)
  return jnp.where(jnp.isnan(x), x, lax.bitcast_convert_type(u, jnp.float32))


def _operands(a, b, precision: str, interpret: bool):
  """(a, b, lax precision) of a product at `precision`; interpret mode rounds "tf32" operands."""
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
  """float32 op(a) @ op(b) of 2-D tiles in a kernel; products at "highest", "tf32" or "bf16"."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  a, b, prec = _operands(a, b, precision, interpret)
  return lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32)


def abstract_h200_mesh():
  """An abstract one-device H200 mesh, to lower kernels without a GPU."""
  from jax.sharding import AbstractDevice, AbstractMesh
  return AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="NVIDIA H200", num_cores=None, platform="cuda"))


def lower_for_cuda(fn, *args, donate_argnums=()):
  """Lowers `jax.jit(fn)` for CUDA on any machine (Triton lowering included); returns the text.

  Catches what the Triton lowering rejects; ptxas limits still need a GPU.
  """
  from jax.sharding import use_abstract_mesh
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=DEPRECATION_MESSAGE)
    with use_abstract_mesh(abstract_h200_mesh()):
      lowered = jax.jit(fn, donate_argnums=donate_argnums).trace(*args).lower(
          lowering_platforms=("cuda",))
  return lowered.as_text()


def triton_kernels(fn, *args, donate_argnums=()):
  """{name: (Triton IR, num_warps, num_stages)} of each distinct Pallas kernel of
  `jax.jit(fn)(*args)`: kernels of one name with different IR are `name`, `name#2`, ...

  Works on any machine; `tools/sass.py` compiles the IR to SASS.
  """
  import re
  from jax._src.pallas.triton import lowering
  irs = {}
  original = lowering.lower_jaxpr_to_triton_module

  def capture(*a, **k):
    result = original(*a, **k)
    op = result.module.operation
    name = str(op.attributes["sym_name"]).strip('"')
    ir = op.get_asm(enable_debug_info=False)
    same = [key for key in irs if key.split("#")[0] == name]
    if all(irs[key] != ir for key in same):
      irs[name + (f"#{len(same) + 1}" if same else "")] = ir
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  try:
    text = lower_for_cuda(fn, *args, donate_argnums=donate_argnums)
  finally:
    lowering.lower_jaxpr_to_triton_module = original
  params = {m[1]: (int(m[3]), int(m[2])) for m in re.finditer(
      r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)}
  base = lambda key: key.split("#")[0]
  if set(params) != {base(key) for key in irs}:
    raise ValueError(f"launch parameters not found for "
                     f"{sorted({base(key) for key in irs} - set(params))}")
  return {key: (ir,) + params[base(key)] for key, ir in irs.items()}

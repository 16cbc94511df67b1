"""Ahead-of-time Triton lowering of every kernel plan at Bolt geometry, on any machine.

Interpret mode accepts what the Triton lowering rejects (blocks whose size is not a power of
two, primitives without a Triton rule); lowering for an abstract H200 catches those on CPU.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import m2v_jax as m
from m2v_jax import dispatch, status
from m2v_jax.kernels import backend, chunk_scan
from tests.helpers import matrix

pytestmark = pytest.mark.lowering
sds = jax.ShapeDtypeStruct


def lower(cfg, B, R, z=False, dtype=jnp.bfloat16, chunked=False, E=None, chunk_tiles=None,
          ragged=False):
  """Lowers one call (`ragged`: a chunked prefill handing off at num_rows)."""
  args = dispatch.abstract_call_args(cfg, B, R, z, dtype, E)

  def f(p, s, a):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=chunked, ragged=ragged,
                         chunk_tiles=chunk_tiles)

  return backend.lower_for_cuda(f, *args, donate_argnums=(1,))


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
@pytest.mark.parametrize("R,z", matrix([(1, False), (8, False), (8, True), (5, False), (37, False)],
                                       keep={0, 2, 4}))
def test_verify_plans_lower_to_triton(mode, R, z):
  cfg = m.BOLT.replace(replay_mode=mode)
  text = lower(cfg, 2, R, z)
  assert text.count("__gpu$xla.gpu.triton") == 2
  # the state leaves are aliased to outputs (updated in place when donated)
  # the conv launch aliases the conv state (compact: and the last call's rows and the ring),
  # the SSM launch the SSM state (compact: and pending, starts, origin, last_bits)
  assert text.count("output_operand_alias<") == (2 if mode == "snapshot" else 9)
  assert "tf.aliasing_output" in text                  # and the jit donates them


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_device_entries_checked_in_the_conv_launch(mode):
  """With pool entries known only on the device (a serving loop's jitted step), a verify call
  is its two launches and nothing else: the conv launch rejects shared entries itself. (Odd B:
  the entry vector is padded to a power of two inside the kernel.)"""
  import re
  cfg = m.BOLT.replace(replay_mode=mode)

  def f(p, s, a):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False, ragged=False,
                         entries_checked=False)

  args = dispatch.abstract_call_args(cfg, 3, 8)
  text = backend.lower_for_cuda(f, *args, donate_argnums=(1,))
  assert text.count("__gpu$xla.gpu.triton") == 2
  ops = set(re.findall(r"stablehlo\.(\w+)", text))
  assert ops <= {"custom_call", "constant", "optimization_barrier", "output_operand_alias",
                 "mesh"}, ops
  # ... and the check is in the conv launch: its kernel differs from a host-checked call's.
  conv = f"m2v_conv_{mode}_r8"
  device = backend.triton_kernels(lambda p, s, a: f(p, s, a), *args,   # a new function: not
                                  donate_argnums=(1,))[conv][0]          # the cached lowering
  host = backend.triton_kernels(
      lambda p, s, a: dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False,
                                    ragged=False), *args, donate_argnums=(1,))[conv][0]
  assert device != host


@pytest.mark.parametrize("R", [1, 8, 37])
def test_bf16_products_contract_at_least_16(R):
  """bf16 tensor-core products need k >= 16 (mma k16); with bfloat16 activations every bf16
  dot of the verify kernels contracts at least that many, the shorter ones run TF32."""
  import re
  cfg = m.BOLT.replace(replay_mode="compact")

  def f(p, s, a):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False, ragged=False)

  irs = backend.triton_kernels(f, *dispatch.abstract_call_args(cfg, 2, R, False, jnp.bfloat16, None),
                               donate_argnums=(1,))
  dots = re.findall(r"tensor<(\d+)x(\d+)xbf16> \* tensor<(\d+)x(\d+)xbf16>",
                    irs[f"m2v_ssm_compact_r{R}"][0])
  assert dots, "no bf16 products: the test cannot tell"
  assert all(int(k) >= backend.BF16_MIN_K for _, k, _, _ in dots), dots


@pytest.mark.parametrize("act,R,fewer", [(jnp.bfloat16, 20, (1, 2)), (jnp.float16, 8, (1, 1))])
def test_16bit_state_takes_fewer_y_passes(act, R, fewer):
  """y's S·Cᵀ splits a float32 state into three bf16 parts per state chunk (bfloat16
  activations), or a TF32 head and middle (float16 activations); a stored float16 state needs
  one part less, a bfloat16 one two less in bf16 (one in TF32). R = 20: the body's segments,
  whose state is not rounded as stored, keep every part."""
  cfg = m.Mamba2Config(nheads=4, headdim=64, dstate=128, ngroups=2, replay_mode="compact")

  def dots(state_dtype):
    p, _, a = dispatch.abstract_call_args(cfg, 2, R, dtype=act)
    s = m.state_shapes(cfg, 2, act, state_dtype=state_dtype)
    irs = backend.triton_kernels(
        lambda p, s, a: dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False,
                                      ragged=False), p, s, a, donate_argnums=(1,))
    return irs[f"m2v_ssm_compact_r{R}"][0].count("tt.dot ")

  chunks = cfg.dstate // m.tile_config(cfg, 2).n_cols
  full = dots(jnp.float32)
  assert [full - dots(jnp.float16), full - dots(jnp.bfloat16)] == [f * chunks for f in fewer]


@pytest.mark.parametrize("act,passes", [
    (jnp.bfloat16, {"fused": ["bf16 64x128*128x32"] * 3 + ["bf16 64x128*128x64"]
                    + ["bf16 64x64*64x32"] * 3 + ["bf16 32x64*64x128"] * 3}),
    (jnp.float16, {"cb": ["tf32"], "states": ["tf32"] * 2, "out": ["tf32"] * 4}),
    (jnp.float32, {"cb": ["tf32x3"], "states": ["tf32x3"], "out": ["tf32x3"] * 2})])
def test_highest_prefill_keeps_activation_operands_whole(act, passes):
  """At "highest" the chunked prefill's products keep 16-bit post-conv rows (x, B, C) whole:
  C·Bᵀ one pass; a product with a float32 operand (decay-weighted B or C·Bᵀ, the starting
  state) three bf16 passes on its parts (bfloat16 activations: in the one kernel of the
  table's entry, P tiles of 32, by the operands' shapes C·stᵀ's three [64, N]·[N, 32],
  C·Bᵀ's one [64, N]·[N, 64], the causal sum's three [64, 64]·[64, 32], the state update's
  three [32, 64]·[64, N]) or a TF32 head and middle (float16); float32 activations keep
  three TF32 passes of every product."""
  cfg = m.BOLT.replace(prefill_precision="highest")
  irs = backend.triton_kernels(
      lambda p, s, a: dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=True,
                                    ragged=False),
      *dispatch.abstract_call_args(cfg, 1, 200, dtype=act), donate_argnums=(1,))
  for kernel, want in passes.items():
    dots = re.findall(r"tt\.dot .*inputPrecision = (\w+) : tensor<(\w+)> \* tensor<(\w+)>",
                      irs[f"m2v_chunk_{kernel}_snapshot"][0])
    split = lambda t: t.rsplit("x", 1)               # (shape, element type)
    got = []
    for precision, a, b in dots:
      (sa, operand), (sb, _) = split(a), split(b)
      p = "bf16" if operand == "bf16" else precision
      got.append(f"{p} {sa}*{sb}" if " " in want[0] else p)
    assert got == want, kernel


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_pool_and_odd_geometry_lower(mode):
  """A pool larger than the batch, H not a power of two (Mamba2-2.7B: 80 heads), float32."""
  cfg = m.Mamba2Config(nheads=80, headdim=64, dstate=128, ngroups=1, replay_mode=mode)
  text = lower(cfg, 3, 8, dtype=jnp.float32, E=7)
  assert text.count("__gpu$xla.gpu.triton") == 2


def test_committed_state_fold_lowers():
  cfg = m.BOLT.replace(replay_mode="compact")
  state = m.state_shapes(cfg, 2, jnp.bfloat16)
  f = lambda p, s, r: dispatch.committed(p, s, status.call_args(None, None, r), cfg=cfg,
                                         backend="pallas")
  text = backend.lower_for_cuda(f, m.random_params(cfg), state, sds((2,), jnp.int32))
  assert text.count("__gpu$xla.gpu.triton") == 2


def chunked_launches(mode: str, segments: int = 1, fills: bool = False) -> int:
  """Launches of a Bolt bf16 chunked prefill: per segment body conv (1) + chunked scan (4, 3
  with fused_pass, 1 with the table's fused_y), with fused_y the fill of the last segment's
  slots where the layout is the device's (`fills`); verify tail (conv, ssm; the ssm writes
  the tail's y into the prefill's) + compact fold (conv, ssm)."""
  t = m.chunk_tile_config(m.BOLT, "bf16")
  scan = 1 if t.fused_y else 4 - t.fused_pass
  return (segments * (1 + scan) + (1 if fills and t.fused_y else 0) + 2
          + (2 if mode == "compact" else 0))


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
@pytest.mark.parametrize("B,R,z,segments", matrix([
    (2, 4096, False, 1), (1, 8192, True, 2), (2, 77, True, 1), (1, 37, False, 1)],
    keep={1, 2, 3}))
def test_chunked_prefill_lowers(mode, B, R, z, segments):
  """Long and short calls; at R=37 y has fewer rows than one chunk; at R=8192 the body's
  scratch takes two segments (states carried between them)."""
  cfg = m.BOLT.replace(replay_mode=mode)
  plan = dispatch.chunk_plan(cfg, "pallas", m.state_shapes(cfg, B), B * R, B, jnp.bfloat16,
                             z, R - cfg.capacity)
  assert len(plan.segments) == segments
  text = lower(cfg, B, R, z, chunked=True)
  assert text.count("__gpu$xla.gpu.triton") == chunked_launches(mode, segments)


@pytest.mark.parametrize("B,R", [(1, 512), (2, 4096), (1, 8192)])
def test_snapshot_prefill_is_its_launches_alone(B, R):
  """A snapshot prefill (the host's layout, every num_rows valid) lowers to its launches and
  nothing else: the body conv forms the per-sequence table from cache_indices and state_row,
  the tail reads its rows from the flat ones and writes y in place (reshapes are free)."""
  text = lower(m.BOLT, B, R, chunked=True)
  assert text.count("__gpu$xla.gpu.triton") == chunked_launches("snapshot", 2 if R > 4096 else 1)
  ops = set(re.findall(r"stablehlo\.(\w+)", text))
  assert ops <= {"custom_call", "constant", "optimization_barrier", "output_operand_alias",
                 "mesh", "reshape"}, ops


def test_segments_share_compiled_kernels():
  """A Bolt bf16 prefill of 16384 rows runs in four segments; its 10 Triton launches hold 7
  distinct kernels (XLA compiles each distinct custom call once): the conv two (the last
  segment's slot table is longer), the fused scan three (the first segment has no y or
  carried state in, the last no state out), beside the verify tail's two."""
  cfg = m.BOLT
  plan = dispatch.chunk_plan(cfg, "pallas", m.state_shapes(cfg, 1), 16384, 1, jnp.bfloat16,
                             False, 16384 - cfg.capacity)
  assert len(plan.segments) == 4
  text = lower(cfg, 1, 16384, chunked=True)
  configs = re.findall(r"mhlo\.backend_config = \{(.*?)\}[^{}]*: \(", text, re.S)
  assert len(configs) == text.count("__gpu$xla.gpu.triton") == chunked_launches("snapshot", 4)
  assert len(set(configs)) == 7


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_ragged_prefill_lowers(mode):
  text = lower(m.BOLT.replace(replay_mode=mode), 3, 300, chunked=True, ragged=True)
  assert text.count("__gpu$xla.gpu.triton") == chunked_launches(mode, fills=True)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
@pytest.mark.parametrize("z", matrix([False, True], keep={1}))
def test_packed_prefill_lowers(mode, z):
  """Device offsets and entries: the same launches as a chunked prefill, nothing else of the
  library's own."""
  cfg = m.BOLT.replace(replay_mode=mode)
  T, S = 1000, 5
  sds = jax.ShapeDtypeStruct
  p, state, _ = dispatch.abstract_call_args(cfg, S, 1)
  args = status.CallArgs(sds((T, cfg.conv_dim), jnp.bfloat16), sds((T, cfg.nheads), jnp.bfloat16),
                         sds((S,), jnp.int32), sds((T, cfg.d_inner), jnp.bfloat16) if z else None,
                         sds((S,), jnp.int32), None)
  f = lambda p, s, a, cu: dispatch.packed(p, s, a, cu, cfg=cfg, backend="pallas",
                                          entries_checked=False)
  text = backend.lower_for_cuda(f, p, state, args, sds((S + 1,), jnp.int32), donate_argnums=(1,))
  assert text.count("__gpu$xla.gpu.triton") == chunked_launches(mode, fills=True)


@pytest.mark.parametrize("precision,dtype", matrix(
    [(p, d) for d in (jnp.float32, jnp.bfloat16) for p in ("highest", "tf32", "bf16")],
    keep={0, 1, 5}))
def test_chunked_prefill_lowers_at_each_precision(precision, dtype):
  lower(m.BOLT.replace(prefill_precision=precision), 1, 200, dtype=dtype, chunked=True)


@pytest.mark.parametrize("tiles", [m.ChunkTiles(chunk=8), m.ChunkTiles(local_block_p=8),
                                   m.ChunkTiles(block_p=8, fused_pass=1)])
def test_compiled_chunk_tiles_below_16_are_rejected(tiles):
  """Triton's smallest dot is 16 wide: compiled, such tiles get a clear error (interpret mode
  takes them)."""
  with pytest.raises(ValueError, match=">= 16"):
    lower(m.BOLT, 1, 200, chunked=True, chunk_tiles=tiles)


def test_state_passing_takes_narrow_p_tiles():
  """The state-passing kernel (unfused) has no dot: P tiles below 16 lower (here 4 rows)."""
  text = lower(m.BOLT, 1, 200, chunked=True, chunk_tiles=m.ChunkTiles(block_p=4))
  assert text.count("__gpu$xla.gpu.triton") == 7


def test_triton_kernels_capture_ir_and_launch_params():
  """`backend.triton_kernels` returns each kernel's Triton IR with the launch parameters of
  the tile table."""
  cfg = m.BOLT.replace(replay_mode="compact")

  def f(p, s, a):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False, ragged=False)

  kernels = backend.triton_kernels(f, *dispatch.abstract_call_args(cfg, 1, 8),
                                   donate_argnums=(1,))
  assert sorted(kernels) == ["m2v_conv_compact_r8", "m2v_ssm_compact_r8"]
  ir, warps, stages = kernels["m2v_ssm_compact_r8"]
  tiles = m.tile_config(cfg, 1)
  assert (warps, stages) == (tiles.num_warps, tiles.num_stages)
  assert "tt.func public @m2v_ssm_compact_r8" in ir and "loc(" not in ir
  # The B=1 entry's block_p: the state chunks are [block_p, n_cols] tiles.
  assert f"tensor<{tiles.block_p}x{tiles.n_cols}xf32>" in ir
  assert f"tensor<{m.tile_config(cfg).block_p}x{tiles.n_cols}xf32>" not in ir


@pytest.mark.parametrize("dtype, block_p", [(jnp.bfloat16, 32), (jnp.float32, 64)])
def test_b1_snapshot_prefill_takes_its_p_tiles(dtype, block_p):
  """A B=1 snapshot prefill on the verify kernels runs 32-row P tiles with bf16 activations and
  the table's 64 with float32 ones, as `ops.prefill` picks them (through `dispatch.call`)."""
  cfg = m.BOLT

  def f(p, s, a):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False, ragged=False)

  kernels = backend.triton_kernels(f, *dispatch.abstract_call_args(cfg, 1, 37, dtype=dtype),
                                   donate_argnums=(1,))
  ir = kernels["m2v_ssm_snapshot_r37"][0]
  n_cols = m.tile_config(cfg).n_cols
  assert f"tensor<{block_p}x{n_cols}xf32>" in ir
  # [32, n_cols] also names a 32-row segment's B and C tiles: only a 64-row tile tells.
  assert (f"tensor<64x{n_cols}xf32>" in ir) == (block_p == 64)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
def test_chunked_prefill_lowers_for_headdim_96(mode):
  """headdim not a power of two: the chunked scan takes P in power-of-two tiles (32 here)."""
  cfg = m.Mamba2Config(nheads=8, headdim=96, dstate=64, ngroups=2, replay_mode=mode)
  assert chunk_scan.supported(cfg)
  text = lower(cfg, 2, 136, chunked=True)
  assert text.count("__gpu$xla.gpu.triton") == (7 if mode == "snapshot" else 9)


@pytest.mark.parametrize("mode", ["snapshot", "compact"])
@pytest.mark.parametrize("R", [8, 5])
def test_tree_verify_lowers(mode, R):
  """A draft tree's call with device `parents` and entries (a serving loop's jitted step)
  lowers to Triton for an H200 as its two launches and nothing else, the state updated in
  place: the conv launch checks the parents and pads them to the tile's rows itself."""
  cfg = m.BOLT.replace(replay_mode=mode)
  args = dispatch.abstract_call_args(cfg, 2, R)

  def f(p, s, a, parents):
    return dispatch.call(p, s, a, cfg=cfg, backend="pallas", chunked=False, ragged=False,
                         entries_checked=False, parents=parents)

  text = backend.lower_for_cuda(f, *args, sds((2, R), jnp.int32), donate_argnums=(1,))
  assert text.count("__gpu$xla.gpu.triton") == 2
  assert text.count("output_operand_alias<") == (2 if mode == "snapshot" else 9)
  ops = set(re.findall(r"stablehlo\.(\w+)", text))
  assert ops <= {"custom_call", "constant", "optimization_barrier", "output_operand_alias",
                 "mesh"}, ops


def ssm_ir(mode, R):
  """Triton IR of the SSM kernel of a B=1 serial prefill of R rows at Bolt (the table's tiles)."""
  cfg = m.BOLT.replace(replay_mode=mode)
  tiles = m.tile_config(cfg, 1)
  irs = backend.triton_kernels(
      lambda p, s, a: dispatch.kernel_call(cfg, "pallas", p, s, a, tiles),
      *dispatch.abstract_call_args(cfg, 1, R), donate_argnums=(1,))
  return irs[f"m2v_ssm_{mode}_r{R}"][0]


def test_a_body_ending_in_a_partial_segment_compiles_one_copy_of_the_segment():
  """A body of whole 32-row segments plus a partial one runs it as the loop's last segment:
  the SSM kernel has as many dots as a body of whole segments (a second copy of the segment
  code beside the loop took up to 1.4x the time)."""
  def dots(R):
    return ssm_ir("compact", R).count("tt.dot ")

  whole = dots(72)                                   # 64 body rows
  assert whole > 0
  for R in (45, 48, 80):                             # 32 + 5, 32 + 8, 64 + 8 body rows
    assert dots(R) == whole, R


def test_a_body_of_one_segment_compiles_in_a_loop():
  """A body of one segment, whole or partial, runs in a loop of one trip whose count the
  compiler cannot fold, as the longer bodies' segments do: compiled straight on, it took 255
  registers at B=1 R=37 and 1.4x the instructions (190 registers in the loop)."""
  def loops(R):
    """(loops, loops whose trip count is not built from constants) of the SSM kernel."""
    text = ssm_ir("snapshot", R)
    consts = set(re.findall(r"(%\w+) = arith\.constant", text))
    bounds = re.findall(r"scf\.for %\w+ = %\w+ to (%\w+) step", text)

    def opaque(v):
      op, args = re.search(rf"{re.escape(v)} = (\S+) ([^:]*):", text).groups()
      return not (op == "arith.constant"
                  or op == "arith.addi" and all(a.strip() in consts for a in args.split(",")))

    return len(bounds), sum(map(opaque, bounds))

  n, opaque = loops(72)                              # 64 body rows: two segments
  assert n > 0
  for R in (20, 37, 40):                             # 12, 29 and 32 body rows
    assert loops(R) == (n, opaque + 1), R


@pytest.mark.parametrize("mode,z,body_rows,R,capacity", [
    ("snapshot", False, 8, 77, 8), ("compact", True, 16, 77, 8), ("snapshot", True, 32, 77, 8),
    ("compact", True, 0, 77, 8), ("snapshot", True, 32, 20, 8), ("compact", False, 32, 60, 5)])
def test_body_rows_lower(mode, z, body_rows, R, capacity):
  """`TileConfig.body_rows`: long calls on the verify kernels, their body folded in products
  (or row by row at 0); a short body, bodies ending in a partial segment, a capacity below KT."""
  cfg = m.BOLT.replace(replay_mode=mode, capacity=capacity)
  tiles = m.tile_config(cfg, 1).replace_from_text(f"64:4:64:body_rows={body_rows}")
  args = dispatch.abstract_call_args(cfg, 1, R, z)
  text = backend.lower_for_cuda(
      lambda p, s, a: dispatch.kernel_call(cfg, "pallas", p, s, a, tiles), *args,
      donate_argnums=(1,))
  assert text.count("__gpu$xla.gpu.triton") == 2

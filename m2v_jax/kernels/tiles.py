"""Kernel launch parameters keyed by geometry, picked from measured sweeps (never autotuned)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from m2v_jax import config as config_lib


def _check_powers_of_two(tiles, names) -> None:
  """Raises ValueError naming the first field in `names` that is not a power of two."""
  for name in names:
    v = getattr(tiles, name)
    if v < 1 or v & (v - 1):
      raise ValueError(f"{type(tiles).__name__}.{name}: expected a power of two, got {v}")


def _fields_from_text(text: str, ordered, known):
  """(names, value strings, how many came in order) of `text`: values joined by ":" for the
  `ordered` names in turn, then `name=value`; None where a value follows a named one,
  values outnumber `ordered`, or a name is not in `known` or given twice."""
  items = text.split(":")
  values = [v for v in items if "=" not in v]
  pairs = [v.split("=", 1) for v in items if "=" in v]
  given = list(ordered[:len(values)]) + [k for k, _ in pairs]
  if (len(values) > len(ordered) or items[:len(values)] != values
      or not set(given) <= set(known) or len(set(given)) != len(given)):
    return None
  return given, values + [v for _, v in pairs], len(values)


def next_pow2(n: int) -> int:
  """The smallest power of two >= n (>= 1)."""
  return 1 << max(n - 1, 0).bit_length()


def pow2_divisor(n: int, cap: int) -> int:
  """Largest power of two that divides n and is <= cap."""
  d = 1
  while d * 2 <= cap and n % (d * 2) == 0:
    d *= 2
  return d


@dataclasses.dataclass(frozen=True)
class TileConfig:
  """Launch parameters of the verify kernels.

  n_cols fixes the products' summation order: kernels that must agree bitwise use the same.
  block_p and num_warps tile the products' rows only: compiled on an H200, y and states are
  bitwise the same at 64:4, 64:8, 32:4, 32:2 and 16:2 (`tools/tiles_bitwise.py`: B=3, calls
  of capacity rows, the default window, float32 state, no gate).

  Attributes:
    block_p: P rows of an SSM program's [block_p, N] state tile.
    num_warps, num_stages: the SSM program's warps and pipelining depth.
    n_cols: columns of the state's chunks (at most N).
    block_c: conv channels per conv program.
    prep_warps: warps per conv program.
    tree_recompute: in a draft tree's snapshot SSM program, a row whose parent is not the
      row run before starts from the parent's state refolded along the parent's path from
      the root row's state (held in registers; with tree_y_after, from the call's start
      state) when the rows to walk are at most this many (the path after the root; with
      tree_cache, the part after the cached parent), else from the parent's slot reloaded
      from memory (0: always reloaded). The two are bitwise the same.
    tree_cache: 1: that refold starts from the last refolded parent's state (a third state
      tile in registers) where that parent is this one or one of its ancestors (siblings
      listed side by side, as breadth-first trees list them, walk no rows); 0: from the
      root row's state. The same bits either way.
    tree_order: the order in which a draft tree's snapshot SSM program runs the rows. 1: a
      child of the row just run where there is one (the lowest), else the lowest row not yet
      run, so only a row after a leaf starts off the row run before it (random 16-row trees:
      7.0 such rows, against 11.7 in row order); 0: row order. The same bits either way.
    tree_y_after: 1: a draft tree's snapshot SSM program computes y after its rows (from the
      start state, which it then keeps in registers, its refolds starting there rather than
      from the root's state; y's tiles loaded then), 0: before them, as a chain's. The same
      bits either way.
    body_rows: a call of more than capacity rows on the verify kernels runs the rows before
      its kept ones in segments of this many rows (a power of two >= 8; a shorter body in
      segments of its rows rounded up to a power of two >= 8), each folded in one product
      from the segment's start state (the SSD dual form, as y), in both modes; 0: segments
      of capacity rows, folded row by row. The two agree to float32 rounding, not bit for
      bit. 32 by default: at Bolt on the H200 (B=1) it took 0.83x, 0.64x and 0.57x the
      row-by-row body's time at R=37, 72 and 136 (BENCHMARKS.md, "Prefill: short prompts
      in 32-row products").

  Raises:
    ValueError: a size that is not a power of two, num_stages below 1, tree_recompute
      below 0, tree_cache, tree_order or tree_y_after not 0 or 1, body_rows neither 0 nor
      a power of two >= 8.
  """

  block_p: int
  num_warps: int
  num_stages: int = 1
  n_cols: int = 64
  block_c: int = 128
  prep_warps: int = 4
  tree_recompute: int = 8
  tree_cache: int = 0
  tree_order: int = 1
  tree_y_after: int = 0
  body_rows: int = 32

  def __post_init__(self):
    _check_powers_of_two(self, ("block_p", "num_warps", "block_c", "prep_warps", "n_cols"))
    if self.num_stages < 1:
      raise ValueError(f"TileConfig.num_stages: expected >= 1, got {self.num_stages}")
    if self.tree_recompute < 0:
      raise ValueError(f"TileConfig.tree_recompute: expected >= 0, got {self.tree_recompute}")
    for name in ("tree_cache", "tree_order", "tree_y_after"):
      if getattr(self, name) not in (0, 1):
        raise ValueError(f"TileConfig.{name}: expected 0 or 1, got {getattr(self, name)}")
    if self.body_rows and (self.body_rows < 8 or self.body_rows & (self.body_rows - 1)):
      raise ValueError(f"TileConfig.body_rows: expected 0 or a power of two >= 8, got "
                       f"{self.body_rows}")

  def replace_from_text(self, text: str) -> "TileConfig":
    """A copy with `block_p:num_warps:n_cols[:num_stages]` from `text`, then any field as
    `:name=value` (e.g. `64:4:64:block_c=512`)."""
    fields = ("block_p", "num_warps", "n_cols", "num_stages")
    known = {f.name for f in dataclasses.fields(self)}
    split = _fields_from_text(text, fields, known)
    given, ints, in_order = split or ((), (), 0)
    if (split is None or in_order < 3
        or not all(v.strip().lstrip("-").isdigit() for v in ints)):
      raise ValueError(f"tiles: expected block_p:num_warps:n_cols[:num_stages] then "
                       f":name=value (integers, each field once) for fields of "
                       f"{sorted(known)}, got {text!r}")
    return dataclasses.replace(self, **{k: int(v) for k, v in zip(given, ints)})


# TileConfig by (nheads, headdim, dstate).
_TILE_TABLE: dict[tuple[int, int, int], TileConfig] = {
    # Bolt: one program (a warpgroup, wgmma) per head (BENCHMARKS.md, "Tiles").
    (128, 64, 128): TileConfig(block_p=64, num_warps=4, n_cols=64),
}
# Bolt split over 2 devices: the same tiles (and the same B=1 entry below).
_TILE_TABLE[(64, 64, 128)] = _TILE_TABLE[(128, 64, 128)]


# B=1 by (nheads, headdim, dstate), for compact calls and for snapshot calls of more than
# capacity rows (a prompt's body) with 16-bit activations: 32-row P tiles, two programs a
# head, about two per SM. Compact verify took 0.93x the table's device time (BENCHMARKS.md,
# loop suite 2026-12-04); a bf16 snapshot prefill 0.98x at R=37 and 0.92x at R=136, a float32
# one 1.32x at R=56 (H100, 2026-12-06; the float32 figure from two separate calls). Snapshot
# verify at B=1 keeps the table's tiles. The same entry for Bolt split over 2 devices (not
# timed there).
_B1_TABLE: dict[tuple[int, int, int], TileConfig] = {
    key: dataclasses.replace(_TILE_TABLE[key], block_p=32) for key in ((128, 64, 128),
                                                                       (64, 64, 128))}


def tile_config(cfg: config_lib.Mamba2Config, batch: int | None = None,
                rows: int | None = None, dtype=None) -> TileConfig:
  """The verify tiles for `cfg`, a call's `batch`, `rows` and activation `dtype` (where a table
  entry depends on them): its table entry, else a heuristic."""
  key = (cfg.nheads, cfg.headdim, cfg.dstate)
  body16 = (rows or 0) > cfg.capacity and dtype is not None and jnp.dtype(dtype).itemsize == 2
  if batch == 1 and key in _B1_TABLE and (cfg.compact or body16):
    return _B1_TABLE[key]
  if key in _TILE_TABLE:
    return _TILE_TABLE[key]
  block_p = pow2_divisor(cfg.headdim, 32)
  return TileConfig(block_p=block_p, num_warps=4 if block_p * cfg.dstate >= 1024 else 1,
                    n_cols=32)


@dataclasses.dataclass(frozen=True)
class ChunkTiles:
  """Launch parameters of the chunked-prefill kernels (`chunk_conv`, `chunk_scan`).

  Powers of two; the kernels shrink P tiles and heads to fit (`chunk_scan.ChunkPlan`).

  Attributes:
    chunk: rows per chunk (>= 16 compiled).
    block_p, num_warps, num_stages: the state-passing kernel's P tile, warps, pipelining;
      with `fused_pass` block_p is the fused kernel's P tile (>= 16 compiled).
    local_block_p: P tile of the chunk-states and output kernels (>= 16 compiled).
    state_warps, state_heads, state_stages: the chunk-states kernel's warps, heads per
      program (sharing the group's B rows) and pipelining.
    out_warps, out_heads, out_stages: the same for the output kernel.
    out_rows: chunk rows per output and C·Bᵀ program.
    fused_pass: 1 runs chunk states and state passing as one kernel (`block_p`,
      `state_warps`, `state_stages`).
    conv_rows, conv_cols, conv_warps: the body conv's block and warps (compiled, a block's
      conv_rows + K-1 input rows are loaded at once, so large conv_rows spill registers).
    scratch_mb: the most scratch (MB, 1e6 bytes) a call's body takes at once, per sequence
      of the call: more body slots run in segments, one after the other
      (`chunk_scan.ChunkPlan.segments`); 0 for no limit.
    out_cols: columns per block of the output kernel's causal sum (0: out_rows; at most
      out_rows).
    out_acum: 1 has the C·Bᵀ kernel, which runs first, sum each slot's cumulative dt·A and
      store it; the output kernel loads it (its causal sum then starts from the C·stᵀ term
      instead of summing dt·A in every column block), and so does the fused pass (with
      fused_pass) for its decay weights.
    fused_y: 1 has the fused pass (needs fused_pass) compute each chunk's y too, from the
      state it carries, at `state_warps` and `state_stages`: no C·Bᵀ, starting-state or
      output kernel (`chunk_scan._chunk_fused_kernel`); its y blocks take out_rows rows and
      its causal sums out_cols columns (0: out_rows), and out_acum and the other out_*
      fields go unused.

  Raises:
    ValueError: a field that must be a power of two and is not, a stage count below 1, a
      scratch_mb that is negative or not finite, fused_pass, out_acum or fused_y not 0 or
      1, fused_y without fused_pass, out_cols not 0 or a power of two up to out_rows.
  """

  chunk: int = 64
  block_p: int = 16
  num_warps: int = 4
  num_stages: int = 1
  local_block_p: int = 64
  state_warps: int = 4
  state_heads: int = 1
  state_stages: int = 1
  out_warps: int = 4
  out_heads: int = 1
  out_stages: int = 1
  conv_rows: int = 32
  conv_cols: int = 256
  conv_warps: int = 4
  out_rows: int = 64
  fused_pass: int = 0
  scratch_mb: float = 100.0
  out_cols: int = 0
  out_acum: int = 0
  fused_y: int = 0

  def __post_init__(self):
    if not 0 <= self.scratch_mb < float("inf"):
      raise ValueError(f"ChunkTiles.scratch_mb: expected a finite value >= 0 (0: no limit), "
                       f"got {self.scratch_mb}")
    for name in ("num_stages", "state_stages", "out_stages"):
      if getattr(self, name) < 1:
        raise ValueError(f"ChunkTiles.{name}: expected >= 1, got {getattr(self, name)}")
    if self.fused_pass not in (0, 1):
      raise ValueError(f"ChunkTiles.fused_pass: expected 0 or 1, got {self.fused_pass}")
    if self.out_acum not in (0, 1):
      raise ValueError(f"ChunkTiles.out_acum: expected 0 or 1, got {self.out_acum}")
    if self.fused_y not in (0, 1):
      raise ValueError(f"ChunkTiles.fused_y: expected 0 or 1, got {self.fused_y}")
    if self.fused_y and not self.fused_pass:
      raise ValueError("ChunkTiles.fused_y=1 needs fused_pass=1 (y comes from the fused pass)")
    if self.out_cols and (self.out_cols & (self.out_cols - 1) or self.out_cols > self.out_rows):
      raise ValueError(f"ChunkTiles.out_cols: expected 0 or a power of two up to out_rows "
                       f"({self.out_rows}), got {self.out_cols}")
    _check_powers_of_two(self, ("chunk", "block_p", "num_warps", "local_block_p",
                                "state_warps", "state_heads", "out_warps", "out_heads",
                                "conv_rows", "conv_cols", "conv_warps", "out_rows"))

  @classmethod
  def from_text(cls, text: str) -> "ChunkTiles":
    """ChunkTiles with fields from `text`: values joined by ":" in the fields' order, then
    any field as `name=value` (e.g. `128:64:fused_pass=1`); fields not given default.

    Raises:
      ValueError: an unknown field, a field given twice, more values than fields, a value
        that is not a number, a positional value after a named one, or a value the fields'
        checks reject.
    """
    names = [f.name for f in dataclasses.fields(cls)]

    def number(name, v):
      return float(v) if name == "scratch_mb" else int(v)

    try:
      split = _fields_from_text(text, names, names)
      if split is None:
        raise ValueError
      fields = {k: number(k, v) for k, v in zip(*split[:2])}
    except ValueError:
      raise ValueError(f"chunk tiles: expected values in the order of {names} joined by ':', "
                       f"then name=value, each field once; got {text!r}") from None
    return cls(**fields)


_BOLT_CHUNK_TILES = ChunkTiles(chunk=64, block_p=16, num_warps=4, num_stages=1,
                               local_block_p=64, state_warps=4, state_heads=16,
                               state_stages=2, out_warps=4, out_heads=1, out_stages=1)
_BOLT_CHUNK_TILES_BF16 = dataclasses.replace(_BOLT_CHUNK_TILES, chunk=64, out_rows=64,
                                             out_cols=64, block_p=64, fused_pass=1,
                                             fused_y=1, state_stages=1, state_warps=4)
# Bolt's bf16 entry before fused_y: the fused pass, then the output kernel in whole chunks.
_BOLT_CHUNK_TILES_BF16_KERNELS = dataclasses.replace(
    _BOLT_CHUNK_TILES, chunk=128, out_rows=128, block_p=64, fused_pass=1, state_stages=3,
    out_cols=32, out_acum=1, out_stages=3, out_warps=8)

# ChunkTiles by (nheads, headdim, dstate, bf16 products).
_CHUNK_TILE_TABLE: dict[tuple[int, int, int, bool], ChunkTiles] = {
    # Bolt, float32 products: 128-row chunks spill registers at 3-pass TF32.
    (128, 64, 128, False): _BOLT_CHUNK_TILES,
    # Bolt, bf16 products: the whole scan in one kernel (`fused_y`: 0.96x the time of the
    # entry before it, "Session 48"), P tiles of 64, the chunk's y and causal sum in one
    # block, one stage, 64-row chunks in 4 warps: against 128-row chunks in 8 warps 0.93x
    # the time at R=512 and 1.01x at 4096 (B=1, interleaved); two programs fit an SM, which
    # a call with more programs than SMs uses (8 packed prompts: 0.79x session 51's time on
    # another H100; BENCHMARKS.md, "Session 52").
    (128, 64, 128, True): _BOLT_CHUNK_TILES_BF16,
    # Bolt split over 2 devices: the same per-group shapes; at bf16 the three kernels (not
    # timed with fused_y, whose 64 programs a sequence would leave half the SMs idle at B=1).
    (64, 64, 128, False): _BOLT_CHUNK_TILES,
    (64, 64, 128, True): _BOLT_CHUNK_TILES_BF16_KERNELS,
}
# ChunkTiles by (nheads, headdim, dstate) at "highest" with bfloat16 activations (the float32
# operands' products in three bf16 passes, `backend.Products`).
_CHUNK_TILE_TABLE_HIGHEST_BF16: dict[tuple[int, int, int], ChunkTiles] = {
    # Bolt: the whole scan in one kernel at 64-row chunks, P tiles of 32 in 4 warps (256
    # programs at B=1, two an SM): 0.84x the time of P tiles of 64 in 8 warps (one an SM) at
    # R=4096 and 0.85x at 512, the same error; those took 0.61x the three kernels' time at
    # R=4096 (H100, "Session 52" and "Session 53").
    (128, 64, 128): dataclasses.replace(_BOLT_CHUNK_TILES_BF16, block_p=32),
}


def chunk_tile_config(cfg: config_lib.Mamba2Config, precision: str = "highest",
                      act_dtype=None) -> ChunkTiles:
  """The chunked-prefill tiles for `cfg`, a product precision and the activation dtype: its
  table entry, else defaults. `act_dtype` None is taken as float32: "highest" with bfloat16
  activations has entries of its own (the fused kernel), which only a given bfloat16 picks."""
  shape = (cfg.nheads, cfg.headdim, cfg.dstate)
  if (precision == config_lib.HIGHEST and act_dtype is not None
      and jnp.dtype(act_dtype) == jnp.bfloat16 and shape in _CHUNK_TILE_TABLE_HIGHEST_BF16):
    return _CHUNK_TILE_TABLE_HIGHEST_BF16[shape]
  return _CHUNK_TILE_TABLE.get(shape + (precision == config_lib.BF16,), ChunkTiles())

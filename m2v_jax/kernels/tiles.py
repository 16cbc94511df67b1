"""Launch parameters of the kernels, keyed by layer geometry.

Tiles are picked by hand from measurements on the H200 (BENCHMARKS.md, "Tiles") and never
autotuned at run time: every launch updates the state in place, so a tuning run would change
it. A geometry missing from a table gets a heuristic.
"""

from __future__ import annotations

import dataclasses

from m2v_jax import config as config_lib


def _check_powers_of_two(tiles, names) -> None:
  """Raises ValueError naming the first field of `tiles` in `names` that is not a power of
  two."""
  for name in names:
    v = getattr(tiles, name)
    if v < 1 or v & (v - 1):
      raise ValueError(f"{type(tiles).__name__}.{name}: expected a power of two, got {v}")


def pow2_divisor(n: int, cap: int) -> int:
  """Largest power of two that divides n and is <= cap."""
  d = 1
  while d * 2 <= cap and n % (d * 2) == 0:
    d *= 2
  return d


@dataclasses.dataclass(frozen=True)
class TileConfig:
  """Launch parameters of the verify kernels (`kernels.verify_conv`, `kernels.verify_ssm`).

  Raises:
    ValueError: a size that is not a power of two, num_stages below 1.

  Attributes:
    block_p: rows of P one SSM program owns (a [block_p, N] float32 state tile).
    num_warps: warps per SSM program.
    num_stages: software-pipelining depth of the SSM program's loops.
    n_cols: the SSM program holds its state as N / n_cols chunks [block_p, n_cols] and runs
      its products chunk by chunk (a power of two, at most N).
    block_c: conv channels one conv program owns.
    prep_warps: warps per conv program.

  (block_p, n_cols, num_warps) fix the order of the products' sums, so every kernel whose
  results must match another's (the two modes) uses the same triple.
  """

  block_p: int
  num_warps: int
  num_stages: int = 1
  n_cols: int = 64
  block_c: int = 128
  prep_warps: int = 4

  def __post_init__(self):
    _check_powers_of_two(self, ("block_p", "num_warps", "block_c", "prep_warps", "n_cols"))
    if self.num_stages < 1:
      raise ValueError(f"TileConfig.num_stages: expected >= 1, got {self.num_stages}")

  def replace_from_text(self, text: str) -> "TileConfig":
    """A copy with `block_p:num_warps:n_cols[:num_stages]` from `text` (the benchmarks' and
    tools' spelling of a variant)."""
    fields = ("block_p", "num_warps", "n_cols", "num_stages")
    values = text.split(":")
    if not 3 <= len(values) <= 4:
      raise ValueError(f"tiles: expected block_p:num_warps:n_cols[:num_stages], got {text!r}")
    return dataclasses.replace(self, **{f: int(v) for f, v in zip(fields, values)})


# TileConfig by (nheads, headdim, dstate).
_TILE_TABLE: dict[tuple[int, int, int], TileConfig] = {
    # Bolt: one program per head (a warpgroup: the y product runs as wgmma), state chunks
    # of 64 columns (BENCHMARKS.md, "Tiles").
    (128, 64, 128): TileConfig(block_p=64, num_warps=4, n_cols=64),
}
# Bolt's heads split over 2 devices: the same tiles, so that y is bitwise one device's.
_TILE_TABLE[(64, 64, 128)] = _TILE_TABLE[(128, 64, 128)]


def tile_config(cfg: config_lib.Mamba2Config) -> TileConfig:
  """The verify tiles for `cfg`'s geometry: a measured table entry, else a heuristic (the
  largest power-of-two P tile up to 32 that divides headdim, state chunks of 32 columns; 4
  warps for tiles of at least 1024 elements, else 1)."""
  key = (cfg.nheads, cfg.headdim, cfg.dstate)
  if key in _TILE_TABLE:
    return _TILE_TABLE[key]
  block_p = pow2_divisor(cfg.headdim, 32)
  return TileConfig(block_p=block_p, num_warps=4 if block_p * cfg.dstate >= 1024 else 1,
                    n_cols=32)


@dataclasses.dataclass(frozen=True)
class ChunkTiles:
  """Launch parameters of the chunked-prefill kernels (`kernels.chunk_conv`,
  `kernels.chunk_scan`: the chunk-states, state-passing and output kernels).

  Attributes:
    chunk: rows per chunk (L; a power of two, >= 16 compiled: the smallest Triton dot).
    block_p: P rows per program of the state-passing kernel (a power of two; it has no dot;
      shrunk to divide headdim).
    num_warps: warps per program of the state-passing kernel.
    num_stages: software-pipelining depth of its loop over chunks.
    local_block_p: P rows per program of the chunk-states and output kernels (a power of two,
      >= 16 compiled; shrunk to divide headdim).
    state_warps: warps per program of the chunk-states kernel.
    state_heads: heads per chunk-states program (a power of two; shrunk to divide the heads
      per group, then halved while the grid would have fewer than
      `chunk_scan.MIN_LOCAL_PROGRAMS` programs): the group's B rows are loaded once for all
      of them.
    state_stages: software-pipelining depth of the chunk-states kernel's loop over its heads.
    out_warps, out_heads, out_stages: the same for the output kernel (its heads share the
      group's C rows and C·Bᵀ).
    conv_rows, conv_cols, conv_warps: rows and channels per program of the body's conv
      kernel, and its warps (powers of two). The kernel raises conv_rows to at least K-1
      (a power of two: only its first block reads the conv state's rows) and lowers it to
      at most the chunk; it shrinks conv_cols to divide conv_dim.

  Raises:
    ValueError: a field that must be a power of two and is not, or a stage count below 1.
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

  def __post_init__(self):
    for name in ("num_stages", "state_stages", "out_stages"):
      if getattr(self, name) < 1:
        raise ValueError(f"ChunkTiles.{name}: expected >= 1, got {getattr(self, name)}")
    _check_powers_of_two(self, ("chunk", "block_p", "num_warps", "local_block_p",
                                "state_warps", "state_heads", "out_warps", "out_heads",
                                "conv_rows", "conv_cols", "conv_warps"))


_BOLT_CHUNK_TILES = ChunkTiles(chunk=64, block_p=16, num_warps=4, num_stages=1,
                               local_block_p=64, state_warps=4, state_heads=16,
                               state_stages=2, out_warps=4, out_heads=1, out_stages=1)
_BOLT_CHUNK_TILES_BF16 = dataclasses.replace(_BOLT_CHUNK_TILES, chunk=128)

# ChunkTiles by (nheads, headdim, dstate, bf16 products).
_CHUNK_TILE_TABLE: dict[tuple[int, int, int, bool], ChunkTiles] = {
    # Bolt, float32 products (3-pass or 1-pass TF32): the fastest of the chunk sweep at
    # R=4096; 64-row chunks, since 128-row chunks spill registers at 3-pass TF32.
    (128, 64, 128, False): _BOLT_CHUNK_TILES,
    # Bolt, bf16 products: 128-row chunks fit the registers and halve the chunk states (0.70x
    # the time of 64-row chunks in a sweep whose state-passing kernel was 4.7x slower than
    # now, most of the gain from that kernel; not re-measured since). Bodies of up to 64 rows
    # keep 64-row chunks (`ChunkPlan.chunk`).
    (128, 64, 128, True): _BOLT_CHUNK_TILES_BF16,
    # Bolt's heads split over 2 devices: the same per-group shapes (not measured on its own).
    (64, 64, 128, False): _BOLT_CHUNK_TILES,
    (64, 64, 128, True): _BOLT_CHUNK_TILES_BF16,
}


def chunk_tile_config(cfg: config_lib.Mamba2Config, precision: str = "highest") -> ChunkTiles:
  """The chunked-prefill tiles for `cfg`'s geometry and the product precision ("highest",
  "tf32", "bf16": `Mamba2Config.prefill_precision_for` of the activation dtype; the default
  is float32's): a measured table entry, else the defaults. (The kernels shrink block_p to
  divide headdim, and short bodies shorten the chunk: `chunk_scan.ChunkPlan.chunk`.)"""
  key = (cfg.nheads, cfg.headdim, cfg.dstate, precision == config_lib.BF16)
  return _CHUNK_TILE_TABLE.get(key, ChunkTiles())

"""Static configuration: layer geometry, the replay-mode option, execution backends, tiles.

Everything here is hashable and static under `jax.jit`; nothing here touches device memory.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax

# ----------------------------------------------------------------------------------------------
# Replay mode option
# ----------------------------------------------------------------------------------------------

SNAPSHOT = "snapshot"
COMPACT = "compact"

# Accepted spellings of the mode option. "0"/"1" are the values of ONNX Runtime's
# `ep.cuda.mamba2verify_compact_replay` session option ("0": per-row snapshots, "1": compact).
_MODE_SPELLINGS = {"snapshot": SNAPSHOT, "compact": COMPACT, "0": SNAPSHOT, "1": COMPACT}


def parse_replay_mode(value: str) -> str:
  """Normalizes a replay-mode option to "snapshot" or "compact".

  Args:
    value: "snapshot", "compact", or ONNX Runtime's "0" (snapshot) / "1" (compact).

  Returns:
    "snapshot" or "compact".

  Raises:
    ValueError: for any other value (the message lists the accepted values).
  """
  if isinstance(value, str) and value in _MODE_SPELLINGS:
    return _MODE_SPELLINGS[value]
  raise ValueError(
      f"replay_mode: expected one of {sorted(_MODE_SPELLINGS)} "
      f"('0'/'1' as in ONNX Runtime's ep.cuda.mamba2verify_compact_replay), got {value!r}")


# ----------------------------------------------------------------------------------------------
# Layer geometry
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mamba2Config:
  """Geometry and options of one Mamba-2 mixer layer, as the verify ops see it.

  The names follow the Mamba-2 reference implementation (state-spaces/mamba `Mamba2`):
  `nheads` (H), `headdim` (P), `dstate` (N), `ngroups` (G), `d_conv` (K). Head h reads
  group `h // (nheads // ngroups)` (contiguous map). The conv channels are laid out
  `[x (H*P) | B (G*N) | C (G*N)]`, so `conv_dim = H*P + 2*G*N`.

  Attributes:
    nheads: SSM heads H.
    headdim: head dimension P.
    dstate: state dimension N.
    ngroups: B/C groups G; must divide `nheads`.
    d_conv: causal conv width K (the conv state keeps K-1 columns).
    capacity: rows a call can hand off: S slots of the snapshot bank, or W rows of the
      compact window. A verify call takes R <= capacity rows.
    replay_mode: "snapshot" (default; ORT "0") or "compact" (ORT "1"). Validated here, where
      the option is set.
    dt_limit: (lo, hi) clamp applied to dt after softplus; default (0, inf), a no-op.

  Raises:
    ValueError: a non-positive dimension, `ngroups` not dividing `nheads`, a bad
      `replay_mode`, or `dt_limit` with lo > hi.
  """

  nheads: int
  headdim: int
  dstate: int
  ngroups: int = 1
  d_conv: int = 4
  capacity: int = 8
  replay_mode: str = SNAPSHOT
  dt_limit: tuple[float, float] = (0.0, math.inf)

  def __post_init__(self):
    for name in ("nheads", "headdim", "dstate", "ngroups", "d_conv", "capacity"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    if self.d_conv < 2:
      raise ValueError(f"d_conv: expected >= 2 (the conv state keeps d_conv-1 columns), got {self.d_conv}")
    if self.nheads % self.ngroups:
      raise ValueError(
          f"ngroups: expected a divisor of nheads={self.nheads}, got {self.ngroups}")
    object.__setattr__(self, "replay_mode", parse_replay_mode(self.replay_mode))
    lo, hi = (float(v) for v in self.dt_limit)
    if not lo <= hi:
      raise ValueError(f"dt_limit: expected (lo, hi) with lo <= hi, got {self.dt_limit!r}")
    object.__setattr__(self, "dt_limit", (lo, hi))

  @property
  def d_inner(self) -> int:
    """H * P: width of x, z and y."""
    return self.nheads * self.headdim

  @property
  def conv_dim(self) -> int:
    """C = H*P + 2*G*N: conv channels `[x | B | C]`."""
    return self.d_inner + 2 * self.ngroups * self.dstate

  @property
  def heads_per_group(self) -> int:
    return self.nheads // self.ngroups

  def replace(self, **changes) -> "Mamba2Config":
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)


# Nemotron-H / Nemotron-3.5-Bolt mixer geometry (SPEC §1).
BOLT = Mamba2Config(nheads=128, headdim=64, dstate=128, ngroups=8, d_conv=4, capacity=8)


# ----------------------------------------------------------------------------------------------
# Execution backend
# ----------------------------------------------------------------------------------------------

PALLAS = "pallas"          # compiled Pallas kernels (Triton lowering), GPU only
INTERPRET = "interpret"    # the same kernels in Pallas interpret mode (any platform; slow)
REFERENCE = "reference"    # the pure jax.numpy reference, compiled by XLA
BACKENDS = (PALLAS, INTERPRET, REFERENCE)

_default_backend: str | None = None


def set_default_backend(backend: str | None) -> None:
  """Sets the backend ops use when called with `backend=None`.

  Args:
    backend: "pallas", "interpret", "reference", or None to choose automatically
      ("pallas" when JAX's default backend is a GPU, else "reference"). The environment
      variable M2V_JAX_BACKEND gives the initial value.

  Raises:
    ValueError: an unknown backend name.
  """
  global _default_backend
  if backend is not None and backend not in BACKENDS:
    raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
  _default_backend = backend


def resolve_backend(backend: str | None) -> str:
  """The backend an op runs with: the argument, else the default, else by platform."""
  if backend is None:
    backend = _default_backend or os.environ.get("M2V_JAX_BACKEND") or None
  if backend is None:
    return PALLAS if jax.default_backend() == "gpu" else REFERENCE
  if backend not in BACKENDS:
    raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
  return backend


# ----------------------------------------------------------------------------------------------
# Tiles (hand-picked per geometry; never autotuned at run time, since every launch mutates
# the state in place)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TileConfig:
  """Launch parameters of the serial (verify) kernels.

  Attributes:
    block_p: rows of P one SSM program owns (a [block_p, N] f32 state tile in registers).
    num_warps: warps per SSM program. (block_p, num_warps) fixes the reduction order of the
      y readout, so every kernel whose y must match another's uses the same pair.
    num_stages: software-pipelining depth of the SSM program.
    block_c: conv channels one prep program owns.
    prep_warps: warps per prep program.
    unroll: emit verify-sized row loops unrolled with predication (loads issue ahead of
      the stores of earlier rows) rather than as `fori_loop`s; see `verify_kernels._rows`.
    prefetch: rows the SSM kernel loads ahead of the row it computes (None: all rows up
      front). Each prefetched row holds its x, B and C slices in registers.
  """

  block_p: int
  num_warps: int
  num_stages: int = 1
  block_c: int = 128
  prep_warps: int = 4
  unroll: bool = True
  prefetch: int | None = 4


def pow2_divisor(n: int, cap: int) -> int:
  """Largest power of two that divides n and is <= cap."""
  d = 1
  while d * 2 <= cap and n % (d * 2) == 0:
    d *= 2
  return d


# Measured on the H200 (BENCHMARKS.md, "tile sweep"); keyed by (nheads, headdim, dstate).
_TILE_TABLE: dict[tuple[int, int, int], tuple[int, int]] = {
    (128, 64, 128): (16, 4),
}


def tile_config(cfg: Mamba2Config) -> TileConfig:
  """The tiles for `cfg`'s geometry: a measured table entry, else a heuristic."""
  key = (cfg.nheads, cfg.headdim, cfg.dstate)
  if key in _TILE_TABLE:
    block_p, warps = _TILE_TABLE[key]
  else:
    block_p = pow2_divisor(cfg.headdim, 16)
    warps = 4 if block_p * cfg.dstate >= 1024 else 1
  return TileConfig(block_p=block_p, num_warps=warps)


@dataclasses.dataclass(frozen=True)
class ChunkTiles:
  """Launch parameters of the chunked-scan (prefill) kernels (`prefill_kernels`: the
  chunk-states, state-passing and output kernels).

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
      `prefill_kernels.MIN_LOCAL_PROGRAMS` programs): the group's B rows are loaded once
      for all of them.
    state_stages: software-pipelining depth of the chunk-states kernel's loop over its heads.
    out_warps, out_heads, out_stages: the same for the output kernel (its heads share the
      group's C rows and C·Bᵀ).
    conv_rows, conv_cols, conv_warps: rows and channels per program of the body's conv
      kernel, and its warps (powers of two). The kernel raises conv_rows to at least K-1
      (a power of two: only its first block reads the conv state's rows) and lowers it to
      at most the chunk; it shrinks conv_cols to divide conv_dim.
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
    for name in ("chunk", "block_p", "num_warps", "local_block_p", "state_warps",
                 "state_heads", "out_warps", "out_heads", "conv_rows", "conv_cols",
                 "conv_warps"):
      v = getattr(self, name)
      if v < 1 or v & (v - 1):
        raise ValueError(f"ChunkTiles.{name}: expected a power of two, got {v}")


# Measured on the H200 (BENCHMARKS.md, "Chunked-prefill variants": the scan kernels' tiles in
# runs 23 and 26; the conv tiles in run 27, where 32 x 128 channels measured 0.99x of these
# 32 x 256, within 1%, and were not adopted); keyed by (nheads, headdim, dstate).
_CHUNK_TILE_TABLE: dict[tuple[int, int, int], ChunkTiles] = {
    (128, 64, 128): ChunkTiles(chunk=64, block_p=16, num_warps=4, num_stages=1,
                               local_block_p=64, state_warps=4, state_heads=16,
                               state_stages=2, out_warps=4, out_heads=1, out_stages=1),
    # Bolt's heads split over 2 devices: the same per-group shapes (not measured on its own).
    (64, 64, 128): ChunkTiles(chunk=64, block_p=16, num_warps=4, num_stages=1,
                              local_block_p=64, state_warps=4, state_heads=16,
                              state_stages=2, out_warps=4, out_heads=1, out_stages=1),
}


def chunk_tile_config(cfg: Mamba2Config) -> ChunkTiles:
  """The chunked-scan tiles for `cfg`'s geometry: a measured table entry, else the default.
  (The kernels shrink block_p to divide headdim.)"""
  return _CHUNK_TILE_TABLE.get((cfg.nheads, cfg.headdim, cfg.dstate), ChunkTiles())


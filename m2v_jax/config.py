"""Static configuration: layer geometry, the replay-mode option, execution backends."""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp

SNAPSHOT = "snapshot"
COMPACT = "compact"

# "0"/"1": ONNX Runtime's `ep.cuda.mamba2verify_compact_replay` values.
_MODE_SPELLINGS = {"snapshot": SNAPSHOT, "compact": COMPACT, "0": SNAPSHOT, "1": COMPACT}


def parse_replay_mode(value: str) -> str:
  """Normalizes "snapshot", "compact", or ONNX Runtime's "0" / "1"; raises ValueError otherwise."""
  if isinstance(value, str) and value in _MODE_SPELLINGS:
    return _MODE_SPELLINGS[value]
  raise ValueError(
      f"replay_mode: expected one of {sorted(_MODE_SPELLINGS)} "
      f"('0'/'1' as in ONNX Runtime's ep.cuda.mamba2verify_compact_replay), got {value!r}")


@dataclasses.dataclass(frozen=True)
class Mamba2Config:
  """Geometry and options of one Mamba-2 mixer layer (names as state-spaces/mamba `Mamba2`).

  Conv channels are `[x (H*P) | B (G*N) | C (G*N)]`; head h reads group h // (H / G).

  Attributes:
    nheads, headdim, dstate, ngroups, d_conv: H, P, N, G (dividing H), K.
    capacity: rows a call can hand off: S snapshot slots or W window rows; a verify call
      takes R <= capacity rows.
    window: compact deferred commit (opt-in): W, a power of two in [capacity, 32] with
      capacity <= 16; None: a window of `capacity` rows, base written on every fold.
    replay_mode: "snapshot" (default, ORT "0") or "compact" (ORT "1").
    dt_limit: (lo, hi) clamp of dt after softplus; default (0, inf), a no-op.
    prefill_precision: products of the chunked prefill's matmuls, "highest", "tf32" or
      "bf16" (float32 accumulation); None picks by activation dtype (`prefill_precision_for`;
      docs/design.md, "Prefill precision").

  Raises:
    ValueError: a non-positive dimension, `ngroups` not dividing `nheads`, a bad
      `replay_mode`, `dt_limit` with lo > hi, a `window` out of range, an unknown
      `prefill_precision`.
  """

  nheads: int
  headdim: int
  dstate: int
  ngroups: int = 1
  d_conv: int = 4
  capacity: int = 8
  replay_mode: str = SNAPSHOT
  dt_limit: tuple[float, float] = (0.0, math.inf)
  window: int | None = None
  prefill_precision: str | None = None

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
    w = self.window
    if w is not None:
      if (not isinstance(w, int) or isinstance(w, bool) or w & (w - 1) or
          not self.capacity <= w <= MAX_WINDOW or self.capacity > MAX_DEFERRED_CAPACITY):
        raise ValueError(f"window: expected a power of two in [capacity={self.capacity}, "
                         f"{MAX_WINDOW}] with capacity <= {MAX_DEFERRED_CAPACITY}, got {w!r}")
    if self.prefill_precision not in PREFILL_PRECISIONS + (None,):
      raise ValueError(f"prefill_precision: expected one of {PREFILL_PRECISIONS} or None, "
                       f"got {self.prefill_precision!r}")

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
    """H / G: heads that share one group's B and C."""
    return self.nheads // self.ngroups

  @property
  def window_rows(self) -> int:
    """W: rows of the compact window (`window`, else `capacity`)."""
    return self.capacity if self.window is None else self.window

  @property
  def ring_rows(self) -> int:
    """W + capacity: a call's new rows never overwrite the rows it folds."""
    return self.window_rows + self.capacity

  @property
  def deferred(self) -> bool:
    """Whether compact mode defers its commits (`window` set)."""
    return self.window is not None

  @property
  def compact(self) -> bool:
    """Whether `replay_mode` is compact replay (else snapshot)."""
    return self.replay_mode == COMPACT

  def prefill_precision_for(self, act_dtype) -> str:
    """`prefill_precision`, or when None the default for `act_dtype`."""
    if self.prefill_precision is not None:
      return self.prefill_precision
    return _DEFAULT_PRECISION.get(jnp.dtype(act_dtype).name, HIGHEST)

  def replace(self, **changes) -> "Mamba2Config":
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)


# The largest deferred-commit window (its row boundaries fit one int32 bitmask).
MAX_WINDOW = 32
MAX_DEFERRED_CAPACITY = 16

# Default precision: products whose operands keep as many bits as the activations.
HIGHEST, TF32, BF16 = "highest", "tf32", "bf16"
PREFILL_PRECISIONS = (HIGHEST, TF32, BF16)
_DEFAULT_PRECISION = {"bfloat16": BF16, "float16": TF32, "float32": HIGHEST}

# Nemotron-H / Nemotron-3.5-Bolt mixer geometry.
BOLT = Mamba2Config(nheads=128, headdim=64, dstate=128, ngroups=8, d_conv=4, capacity=8)


PALLAS = "pallas"          # compiled Pallas kernels (Triton lowering), GPU only
INTERPRET = "interpret"    # the same kernels in Pallas interpret mode (any platform; slow)
REFERENCE = "reference"    # the pure jax.numpy reference, compiled by XLA
BACKENDS = (PALLAS, INTERPRET, REFERENCE)

_default_backend: str | None = None


def set_default_backend(backend: str | None) -> None:
  """Sets the backend used for `backend=None` ("pallas", "interpret", "reference" or None).

  None chooses by platform; M2V_JAX_BACKEND gives the initial value. Raises ValueError for an
  unknown name.
  """
  global _default_backend
  if backend is not None and backend not in BACKENDS:
    raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
  _default_backend = backend


def resolve_backend(backend: str | None) -> str:
  """The backend an op runs with: the argument, else the default, else by platform.

  Raises ValueError for an unknown name, or "pallas" where JAX sees no GPU.
  """
  if backend is None:
    backend = _default_backend or os.environ.get("M2V_JAX_BACKEND") or None
  platform = jax.default_backend()
  if backend is None:
    return PALLAS if platform == "gpu" else REFERENCE
  if backend not in BACKENDS:
    raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
  if backend == PALLAS and platform != "gpu":
    raise ValueError(
        f"backend='pallas' compiles the kernels for a CUDA GPU, and JAX sees no GPU here "
        f"(default backend: {platform}); use backend='interpret' (the same kernels in "
        f"Pallas interpret mode, slow) or backend='reference' (the jax.numpy reference), or "
        f"install a CUDA build of JAX (pip install 'm2v_jax[cuda13]')")
  return backend

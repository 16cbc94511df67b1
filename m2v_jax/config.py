"""Static configuration: layer geometry, the replay-mode option, execution backends.

Everything here is hashable and static under `jax.jit`; nothing here touches device memory.
Kernel launch parameters (tiles) live beside the kernels, in `m2v_jax.kernels.tiles`.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp

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
    capacity: rows a call can hand off: S slots of the snapshot bank, or the rows of the
      compact window (W). A verify call takes R <= capacity rows, and the next call picks its
      `state_row` among the last min(R, capacity) rows of the previous one.
    window: compact mode's deferred commit (opt-in; snapshot mode ignores it): W rows in the
      window, a power of two in [capacity, 32], with capacity <= 16. Rows accepted by
      earlier calls stay pending in the window, unfolded, ahead of the last call's rows; a
      call folds them in registers and writes the base only when its own rows would not fit
      after them (a flush). None (default): the window is `capacity` rows and every call that
      folds anything writes the base (ONNX Runtime's compact replay).
    replay_mode: "snapshot" (default; ORT "0") or "compact" (ORT "1"). Validated here, where
      the option is set.
    dt_limit: (lo, hi) clamp applied to dt after softplus; default (0, inf), a no-op.
    prefill_precision: the products of the chunked prefill's matmuls (only that path; the
      verify kernels' products are float32-accurate): "highest" (3-pass TF32 on the tensor cores,
      about float32 accuracy), "tf32" (one TF32 pass: operands rounded to 10 mantissa bits),
      "bf16" (operands rounded to bfloat16, 7 bits). Accumulation is float32 in all three.
      None (default) picks by the activation dtype the products whose operands keep as many
      bits as the activations: "bf16" for bfloat16, "tf32" for float16 (the same 10 bits),
      "highest" for float32 (`prefill_precision_for`); operands the kernels compute in
      float32 (decay-weighted x, the starting state) do round to them. docs/design.md, "Prefill precision",
      has the measured error of each.

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
    """Rows of the compact window's ring buffer: W + capacity, so that a call's rows never
    overwrite the rows it folds."""
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
    """The chunked prefill's product precision for activations of `act_dtype`:
    `prefill_precision`, or when None the default by dtype (see the attribute)."""
    if self.prefill_precision is not None:
      return self.prefill_precision
    return _DEFAULT_PRECISION.get(jnp.dtype(act_dtype).name, HIGHEST)

  def replace(self, **changes) -> "Mamba2Config":
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)


# Deferred commit: the largest window (its row boundaries fit one int32 bitmask) and the
# largest verify capacity that goes with it.
MAX_WINDOW = 32
MAX_DEFERRED_CAPACITY = 16

# Chunked-prefill product precisions (`Mamba2Config.prefill_precision`) and the default of
# each activation dtype: products whose operands keep as many bits as the activations.
HIGHEST, TF32, BF16 = "highest", "tf32", "bf16"
PREFILL_PRECISIONS = (HIGHEST, TF32, BF16)
_DEFAULT_PRECISION = {"bfloat16": BF16, "float16": TF32, "float32": HIGHEST}

# Nemotron-H / Nemotron-3.5-Bolt mixer geometry: 128 heads x 64 x 128, 8 groups, K = 4.
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
  """The backend an op runs with: the argument, else the default, else by platform.

  Raises:
    ValueError: an unknown backend name, or "pallas" where JAX sees no GPU (the message
      names the backends that work there).
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

"""Test setup.

Every kernel test class has a compiled variant (marked `gpu`, skipped where JAX sees no GPU)
and an interpret-mode variant (runs anywhere). `pytest -m gpu` on a GPU machine runs the
compiled ones and the GPU-only checks; `pytest -m "not gpu"` everything else. Interpreted,
parametrized tests run a subset of their matrix (`helpers.matrix`); M2V_FULL_MATRIX=1 runs all.

XLA:CPU contracts a*b+c into a fused multiply-add unless told otherwise. The library's
rounding policy (docs/design.md) fuses only the multiply-adds it routes through `fma` on the
GPU and rounds every other product and sum on its own; the CPU suite runs XLA with
`--xla_cpu_max_isa=AVX`, which keeps XLA:CPU from fusing anything, so interpret mode and the
reference round as written (without fused multiply-adds). This must be set before JAX
initializes its CPU backend. Four host devices let the sharding tests run on CPU.

The suite's time is compilation (interpret-mode kernels are large XLA programs that run in
milliseconds): without a CUDA plugin, XLA compiles without LLVM optimization; the workers of
one run share a persistent compilation cache.
"""

import atexit
import gc
import importlib.util
import os
import shutil
import tempfile

_CUDA = any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))
_FLAGS = ["--xla_cpu_max_isa=AVX", "--xla_force_host_platform_device_count=4"]
if not _CUDA:
  _FLAGS.append("--xla_backend_optimization_level=0")
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# Set by the first process (pytest-xdist's controller), inherited by its workers; a cache the
# user names in JAX_COMPILATION_CACHE_DIR is used as it is.
_OWN_CACHE = not {"M2V_TEST_JAX_CACHE", "JAX_COMPILATION_CACHE_DIR"} & set(os.environ)
if _OWN_CACHE:                 # removed when the process that made it exits
  os.environ["M2V_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="m2v_jax_test_cache_")
  atexit.register(shutil.rmtree, os.environ["M2V_TEST_JAX_CACHE"], ignore_errors=True)

# Tracing and lowering allocate millions of short-lived objects; the default collection
# thresholds spend ~12% of the suite in the garbage collector.
gc.set_threshold(100_000, 50, 100)

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import FULL_MATRIX  # noqa: E402

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  jax.config.update("jax_compilation_cache_dir", os.environ["M2V_TEST_JAX_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

ON_GPU = jax.default_backend() == "gpu"


def _map_budget():
  """Half the kernel's per-process limit on memory mappings (vm.max_map_count), or None."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read()) // 2
  except (OSError, ValueError):
    return None


_MAP_BUDGET = _map_budget()


@pytest.fixture(autouse=True)
def _bound_live_executables():
  """Clears JAX's in-memory caches after a test once the process holds half its mappings' limit.

  XLA:CPU maps each loaded executable's code and data separately (about 12 mappings per
  interpret-mode program), and JAX's caches keep them all alive: ~150 interpret-mode tests in
  one worker reach Linux's default limit of 65,530 and XLA:CPU crashes on its next mmap. Later
  compiles of the same programs read the persistent cache."""
  yield
  if _MAP_BUDGET is not None:
    with open("/proc/self/maps") as f:
      if sum(1 for _ in f) > _MAP_BUDGET:
        jax.clear_caches()
        gc.collect()


GPU_SKIP_REASON = "needs a CUDA GPU (compiled Pallas Triton kernels)"
FULL_SKIP_REASON = "a matrix case beyond the default subset (M2V_FULL_MATRIX=1 runs it)"


def pytest_collection_modifyitems(config, items):
  skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
  skip_full = pytest.mark.skip(reason=FULL_SKIP_REASON)
  for item in items:
    if "gpu" in item.keywords:
      if not ON_GPU:
        item.add_marker(skip_gpu)
    elif "full_matrix" in item.keywords and not FULL_MATRIX:
      item.add_marker(skip_full)


def pytest_terminal_summary(terminalreporter):
  skipped = [str(r.longrepr) for r in terminalreporter.stats.get("skipped", [])]
  for reason, line in (
      (GPU_SKIP_REASON, "GPU tests skipped: JAX sees no GPU here; on a GPU machine "
                        "`pytest -m gpu` runs them (BUILD.md, GPU checks)"),
      (FULL_SKIP_REASON, "matrix cases skipped: M2V_FULL_MATRIX=1 runs them (`pytest -m gpu` "
                         "runs the kernel tests' compiled variants in full)")):
    count = sum(reason in r for r in skipped)
    if count:
      terminalreporter.write_line(f"{count} {line}")

#!/usr/bin/env bash
# The test suite: the reference, the kernels in Pallas interpret mode, the ahead-of-time
# Triton lowering for an H200, the example model. On a machine with a CUDA GPU the same
# tests run the compiled kernels, plus the GPU-only tests.
source "$(dirname "$0")/../.ci/venv.sh"
# Bytecode for the common imports first, so the test workers start from it.
"$PY" -c "import jax, jax.experimental.pallas.triton, numpy, pytest, m2v_jax"
"$PY" -m pytest -q -n "${M2V_TEST_WORKERS:-2}" --dist worksteal tests "$@"

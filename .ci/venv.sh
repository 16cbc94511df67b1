# Sourced by the README's commands: creates (or reuses) .venv with Python 3.12 and installs
# the package with the extras given in M2V_EXTRAS (default "test"). Sets PY to its python, and
# turns bytecode caching on for the processes it starts (below).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x .venv/bin/python ]; then
  # .python-version pins 3.12; pyenv (if present) honours it, else try python3.12 directly.
  for cand in python3.12 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' 2>/dev/null; then
      "$cand" -m venv .venv
      break
    fi
  done
  [ -x .venv/bin/python ] || { echo "need Python >= 3.12 (see .python-version)" >&2; exit 1; }
fi
PY="$ROOT/.venv/bin/python"
# Bytecode is cached (under .venv unless PYTHONPYCACHEPREFIX names a place) even where the
# environment sets PYTHONDONTWRITEBYTECODE: without it every process (the test workers, the
# decoder and benchmark runs) recompiles jax on import, ~2-3 s each on a 2-core machine.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$ROOT/.venv/pycache}"
EXTRAS="${M2V_EXTRAS:-test}"
STAMP=".venv/.m2v-installed"
WANT="$(cat pyproject.toml | sha256sum | cut -c1-16) $EXTRAS"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  # --no-compile: Python compiles only the modules it imports, when it imports them.
  "$PY" -m pip install -q --no-compile -e ".[${EXTRAS}]"
  echo "$WANT" > "$STAMP"
fi

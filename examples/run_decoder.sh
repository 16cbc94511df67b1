#!/usr/bin/env bash
# Decodes real text with the example Mamba-2 model through m2v_jax (CPU, or the GPU if JAX
# sees one), speculatively and greedily, in both replay modes, and checks they all agree.
# Extra flags go to examples/decode.py (for example --max_new_tokens=500 --replay_mode=compact).
source "$(dirname "$0")/../.ci/venv.sh"
"$PY" examples/decode.py "$@"

"""m2v_jax: JAX/Pallas GPU kernels that verify speculative-decoding drafts in Mamba-2 models.

See README.md, docs/semantics.md (what the ops compute) and docs/design.md (how).
"""

from m2v_jax import hf, layer, sharding, tree
from m2v_jax.config import (BOLT, COMPACT, SNAPSHOT, Mamba2Config, parse_replay_mode,
                            resolve_backend, set_default_backend)
from m2v_jax.layer import MixerConfig, MixerParams, mixer, state_row_from_accepted
from m2v_jax.kernels.tiles import ChunkTiles, TileConfig, chunk_tile_config, tile_config
from m2v_jax.ops import (committed_state, convert_state, invalid_sequences, prefill,
                         prefill_packed, verify, verify_checked)
from m2v_jax.params import LayerParams, random_params
from m2v_jax.state import (CompactState, SnapshotState, init_state, reset_entries, reset_state,
                           state_from_committed, state_nbytes, state_shapes)

__version__ = "0.1.0"

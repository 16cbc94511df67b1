"""m2v_jax: JAX/Pallas GPU kernels for verifying speculative-decoding drafts in Mamba-2 models.

Two replay modes with one op surface (`verify`, `prefill`, `committed_state`): snapshot (the
state after every row goes to a slot of a bank) and compact replay (one base state plus the
inputs of the pending rows, replayed in registers on the next call). See README.md,
docs/semantics.md (what the ops compute) and docs/design.md (how). `m2v_jax.layer` wraps the
ops into the Mamba-2 mixer layer (projections and gated norm); `m2v_jax.hf` loads Hugging Face
checkpoints into it.
"""

from m2v_jax import hf, layer, sharding
from m2v_jax.config import (BOLT, COMPACT, SNAPSHOT, Mamba2Config, parse_replay_mode,
                            resolve_backend, set_default_backend)
from m2v_jax.layer import MixerConfig, MixerParams, mixer, state_row_from_accepted
from m2v_jax.kernels.tiles import ChunkTiles, TileConfig, chunk_tile_config, tile_config
from m2v_jax.ops import (committed_state, convert_state, invalid_sequences, prefill, verify,
                         verify_checked)
from m2v_jax.params import LayerParams, random_params
from m2v_jax.state import (CompactState, SnapshotState, init_state, reset_entries, reset_state,
                           state_from_committed, state_nbytes, state_shapes)

__version__ = "0.1.0"

"""The Pallas kernels (Triton lowering) and what they share.

- `backend`: the only module that touches `jax.experimental.pallas.triton`;
- `rowmath`: the per-row math of one Mamba-2 step, written once (kernels and reference);
- `tiles`: launch parameters keyed by geometry;
- `verify`, `verify_conv`, `verify_ssm`, `dual`: the verify path of both replay modes
  (verify calls, compact folds, the last rows of a prefill; y in the SSD dual form);
- `chunk_conv`, `chunk_scan`: the chunked prefill's body (conv, then the SSD scan).

Kernel modules import nothing above them: `m2v_jax.dispatch` composes them into calls.
"""

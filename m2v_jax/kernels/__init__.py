"""The Pallas kernels (Triton lowering) and what they share; see docs/design.md."""

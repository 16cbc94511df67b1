"""The example model decodes through the ops: speculative == greedy, snapshot == compact."""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import decode  # noqa: E402
import model as model_lib  # noqa: E402

WEIGHTS = os.path.join(HERE, "..", "examples", "weights", "mamba2_stdlib.npz")


@pytest.fixture(scope="module")
def trained():
  cfg, params, meta = model_lib.load(WEIGHTS)
  return cfg, jax.tree.map(lambda a: a.astype(jnp.float32), params), meta


def test_weights_are_trained(trained):
  _, _, meta = trained
  assert meta["val_bits_per_byte"] < 2.5, meta


@pytest.mark.parametrize("which", ["reference", "kernels"])
def test_speculative_equals_greedy_in_both_modes(trained, backend, which):
  cfg, params, _ = trained
  backend = "reference" if which == "reference" else backend
  n = 48 if which == "reference" else 20
  prompt = decode.DEFAULT_PROMPT.encode()
  runs = {}
  for mode in ("snapshot", "compact"):
    d = decode.Decoder(cfg, params, mode, 8, backend)
    runs[mode] = d.run(prompt, n, True, 3)
  greedy = decode.Decoder(cfg, params, "snapshot", 8, backend).run(prompt, n, False, 3)
  spec, acc = runs["snapshot"][:2]
  assert len(spec) == n
  assert spec == greedy[0], (spec, greedy[0])
  assert runs["compact"][:2] == (spec, acc)
  assert sum(acc) > 0, "no draft was accepted: the speculative path went untested"
  assert len(acc) < n, "every call produced one token"


def test_prompt_lookup_drafts():
  assert decode.lookup_drafts(b"abcXabcYab", 3, 3) == b"cYa"
  assert decode.lookup_drafts(b"xyz", 4, 3) == b""
  assert decode.lookup_drafts(b"aaaa", 2, 2) == b"a"

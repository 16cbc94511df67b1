"""The example model decodes through the ops: speculative == greedy, snapshot == compact."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tests.helpers import FULL

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import decode  # noqa: E402
import model as model_lib  # noqa: E402

from m2v_jax import hf  # noqa: E402

WEIGHTS = os.path.join(HERE, "..", "examples", "weights", "mamba2_stdlib")


@pytest.fixture(scope="module")
def trained():
  cfg, params = hf.load(WEIGHTS)               # a Hugging Face Mamba2 checkpoint directory
  return cfg, params, model_lib.load_meta(WEIGHTS)


def test_weights_are_trained(trained):
  cfg, params, meta = trained
  assert meta["val_bits_per_byte"] < 2.5, meta
  assert cfg.tie_embeddings and params.lm_head is params.embeddings


def test_training_params_round_trip_through_the_hf_layout(tmp_path):
  """`model.save` writes what `hf.load` reads: the example's forward and `hf.forward` agree."""
  mcfg = model_lib.ModelConfig(d_model=32, n_layer=2, nheads=4, headdim=16, dstate=8)
  params = model_lib.init_params(mcfg, seed=3)
  model_lib.save(str(tmp_path), mcfg, params, {"note": "test"})
  cfg, loaded = hf.load(str(tmp_path))
  tokens = jnp.asarray([[5, 17, 99, 3, 200, 42]], jnp.int32)
  want = jax.jit(model_lib.forward_train, static_argnums=0)(mcfg, params, tokens)
  got, _ = hf.forward(cfg, loaded, hf.init_states(cfg, 1), tokens, [0], prefill=True,
                      backend="reference")
  rel = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
  assert rel < 1e-5, rel


# Interpreted, the four layers' kernels make four programs of ~4 s each; the kernels'
# interpret mode is checked in the kernel tests. The reference run compiles the programs that
# the decoder's own run below (test_decoder_marks_the_prompt_and_reports_spread) reuses.
@pytest.mark.parametrize("backend", ["reference", pytest.param("interpret", marks=FULL),
                                     pytest.param("pallas", marks=pytest.mark.gpu)])
def test_speculative_equals_greedy_in_both_modes(trained, backend):
  cfg, params, _ = trained
  n = 48 if backend == "reference" else 20
  prompt = decode.DEFAULT_PROMPT.encode()
  runs, decoders = {}, {}
  for mode in ("snapshot", "compact"):
    decoders[mode] = decode.Decoder(cfg, params, mode, 8, backend)
    runs[mode] = decoders[mode].run(prompt, n, True, 3)
  greedy = decoders["snapshot"].run(prompt, n, False, 3)   # the same programs, one row a call
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


DECODE = os.path.join(HERE, "..", "examples", "decode.py")


def run_decode(*args, timeout=600):
  # The test run's persistent compilation cache (conftest), which holds the decoder's
  # programs that the in-process decoder tests compiled.
  cache = {"JAX_COMPILATION_CACHE_DIR": os.environ["M2V_TEST_JAX_CACHE"],
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"} if (
               "M2V_TEST_JAX_CACHE" in os.environ) else {}
  return subprocess.run([sys.executable, DECODE, *args], capture_output=True, text=True,
                        timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu", **cache))


def test_decoder_bad_flag_is_one_line_and_help_exits_zero():
  bad = run_decode("--replay_mode=bogus")
  assert bad.returncode != 0
  assert "Traceback" not in bad.stdout + bad.stderr
  assert "--replay_mode=bogus: value should be one of <snapshot|compact|0|1>" in bad.stderr
  helped = run_decode("--help")
  assert helped.returncode == 0, helped.stderr
  assert "--max_new_tokens" in helped.stdout and "--repeats" in helped.stdout


def test_decoder_marks_the_prompt_and_reports_spread():
  """The prompt and the generated text are marked; speeds are medians with their range over
  interleaved repeats; the speed-up is a median of paired ratios; the checks pass."""
  out = run_decode("--max_new_tokens=24", "--repeats=2", "--backend=reference")
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  text = out.stdout
  assert "----- prompt (178 bytes) -----" in text
  assert "Unable to initialize backend" not in out.stderr    # JAX's INFO lines are quiet
  assert "----- generated (snapshot, speculative)" in text
  assert text.count("(median of 2;") == 5          # two modes speculative, their trees, greedy
  assert "speculative tree [snapshot, up to 3 branches]" in text
  assert "speculative tree [compact, up to 3 branches]" in text
  assert "median of 2 paired runs" in text
  assert "check: speculative output == greedy output" in text


def test_whitespace_note():
  assert decode.whitespace_note(b"  \n\t") == (
      "(the model generated only whitespace: 4 bytes, b'  \\n\\t')")
  assert decode.whitespace_note(b" x ") == ""


def test_prompt_lookup_trees():
  """Distinct continuations of the matched n-gram merge into a trie grown a level at a time;
  parents come before their children; one continuation is a chain."""
  assert decode.lookup_tree(b"abcXabcYab", 3, 3, 2) == (b"cYX", [0, 1, 1])
  assert decode.lookup_tree(b"abcXabcYabcZab", 4, 3, 3) == (b"cZYX", [0, 1, 1, 1])
  assert decode.lookup_tree(b"abcXabcXab", 3, 3, 2) == (b"cXa", [0, 1, 2])
  assert decode.lookup_tree(b"xyz", 4, 3, 2) == (b"", [])
  drafts, parents = decode.lookup_tree(b"ab1ab2ab3ab4ab", 7, 2, 3)
  assert len(drafts) <= 7 and all(p_ <= i for i, p_ in enumerate(parents))
  assert len(set(zip(parents, drafts))) == len(drafts)      # no node has two equal children


def test_tree_drafts_decode_as_greedy(trained):
  """The decoder with draft trees (reference backend) gives the greedy output and accepts
  drafts, with the same acceptance counts in both modes."""
  cfg, params, _ = trained
  prompt = decode.DEFAULT_PROMPT.encode()
  runs = {mode: decode.Decoder(cfg, params, mode, 8, "reference").run(prompt, 40, True, 3,
                                                                       branches=2)
          for mode in ("snapshot", "compact")}
  greedy = decode.Decoder(cfg, params, "snapshot", 8, "reference").run(prompt, 40, False, 3)[0]
  for out, acc, *_ in runs.values():
    assert out == greedy
    assert sum(acc) > 0 and len(acc) < 40
  assert runs["snapshot"][1] == runs["compact"][1]

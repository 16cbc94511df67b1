"""The mixer layer and the Hugging Face loader against transformers' own Mamba2ForCausalLM.

The fixtures (`tests/fixtures/hf_mamba2`, written by `tools/make_hf_fixtures.py` with torch and
transformers) hold a small random model's safetensors and config.json, its logits for a
40-token prompt (transformers' chunked path: three chunks of 16) and for 20 greedy decode
steps (its one-token path). Here the checkpoint goes through `m2v_jax.hf.load` and
`m2v_jax.layer.mixer`: prefill, one-token decode, and speculative verify calls with rejected
drafts, in both modes, must give transformers' logits within float32 rounding (relative 1e-5)
and its tokens.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from m2v_jax import hf
from m2v_jax import layer as layer_lib
from tests.helpers import matrix, HF_FIXTURE

FIXTURE = HF_FIXTURE
GOLDEN = np.load(os.path.join(FIXTURE, "golden.npz"))
MODES = ["snapshot", "compact"]


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


class HFChecks:
  """Golden logits through each backend (compiled and interpret variants, and the reference)."""

  backend: str

  def _prefill(self, mode, **kw):
    cfg, p = hf.load(FIXTURE, replay_mode=mode, **kw)
    states = hf.init_states(cfg, 1, jnp.float32)
    logits, states = hf.forward(cfg, p, states, GOLDEN["prompt"][None], np.zeros(1, np.int32),
                                prefill=True, backend=self.backend)
    return cfg, p, states, np.asarray(logits[0])

  @pytest.mark.parametrize("mode", matrix(MODES, keep={1}))
  def test_prompt_and_greedy_decode(self, mode):
    cfg, p, states, logits = self._prefill(mode)
    assert rel(logits, GOLDEN["prompt_logits"]) < 1e-5
    tok = int(np.argmax(logits[-1]))
    tokens, row = [tok], np.array([cfg.mixer.ssm.capacity - 1], np.int32)   # the prompt's last row
    for step in range(1, len(GOLDEN["tokens"])):
      out, states = hf.forward(cfg, p, states, np.array([[tok]]), row, backend=self.backend)
      assert rel(out[0, 0], GOLDEN["step_logits"][step]) < 1e-5, step
      tok = int(np.argmax(np.asarray(out[0, 0])))
      tokens.append(tok)
      row = np.zeros(1, np.int32)
    assert tokens == GOLDEN["tokens"].tolist()

  @pytest.mark.parametrize("mode,window", matrix([("snapshot", None), ("compact", None),
                                                  ("compact", 16)], keep={0, 2}))
  def test_speculative_verify_with_rejected_drafts(self, mode, window):
    """Verify calls of 4 rows (last token + 3 drafts); drafts are the golden tokens with some
    replaced by wrong ones, so calls accept 0-3 of them; the accepted rows' logits and the
    resulting tokens are transformers' greedy ones."""
    cfg, p, states, logits = self._prefill(mode, window=window)
    golden = GOLDEN["tokens"].tolist()
    V = cfg.vocab_size
    rng = np.random.default_rng(0)
    done, row = 1, np.array([cfg.mixer.ssm.capacity - 1], np.int32)
    while done < len(golden) - 3:
      drafts = golden[done:done + 3]
      wrong = int(rng.integers(0, 4))            # 3: all drafts right
      if wrong < 3:
        drafts[wrong] = (drafts[wrong] + 1) % V
      rows = np.array([[golden[done - 1]] + drafts])
      out, states = hf.forward(cfg, p, states, rows, row, backend=self.backend)
      out = np.asarray(out[0])
      k = 0                                      # drafts accepted
      while k < 3 and drafts[k] == int(np.argmax(out[k])):
        k += 1
      assert k == wrong if wrong < 3 else k == 3
      for i in range(k + 1):
        assert rel(out[i], GOLDEN["step_logits"][done + i]) < 1e-5, (done, i)
      done += k + 1                              # k drafts and the bonus token
      row = layer_lib.state_row_from_accepted(np.array([k + 1]))


@pytest.mark.gpu
class TestHFCompiled(HFChecks):
  backend = "pallas"


class TestHFInterpret(HFChecks):
  backend = "interpret"


class TestHFReference(HFChecks):
  backend = "reference"


def test_state_row_from_accepted():
  assert layer_lib.state_row_from_accepted([1, 4, 8]).tolist() == [0, 3, 7]
  dev = layer_lib.state_row_from_accepted(jnp.asarray([2, 5], jnp.int32))
  assert isinstance(dev, jax.Array) and dev.dtype == jnp.int32 and dev.tolist() == [1, 4]


def test_config_mapping():
  cfg, p = hf.load(FIXTURE)
  s = cfg.mixer.ssm
  assert (s.nheads, s.headdim, s.dstate, s.ngroups, s.d_conv) == (2, 64, 16, 2, 4)
  assert s.dt_limit == (0.0, float("inf")) and cfg.mixer.d_model == 64
  assert cfg.mamba_layers == (0, 1) and len(p.layers) == 2
  assert p.layers[0].mixer.in_proj.shape == (64, cfg.mixer.d_in_proj)
  nemo = hf.model_config(dict(model_type="nemotron_h", mamba_num_heads=128, mamba_head_dim=64,
                              ssm_state_size=128, n_groups=8, conv_kernel=4, hidden_size=4096,
                              vocab_size=131072, hybrid_override_pattern="M-M*-M",
                              layer_norm_epsilon=1e-5), replay_mode="compact")
  assert nemo.mixer.ssm == m.BOLT.replace(replay_mode="compact", dt_limit=(0.001, float("inf")))
  assert nemo.mixer.decode_dt_limit == (0.0, float("inf"))
  assert nemo.mamba_layers == (0, 2, 5) and nemo.n_layers == 6


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("backbone.layers.1.mixer.dt_bias"), "'backbone.layers.1.mixer.dt_bias' is missing"),
    (lambda t: t.update({"backbone.layers.0.mixer.conv1d.weight": np.zeros((192, 4), np.float32)}),
     r"conv1d.weight has shape \[192, 4\], expected \[192, 1, 4\]"),
    (lambda t: t.pop("lm_head.weight"), "'lm_head.weight' is missing")])
def test_loader_names_a_bad_tensor(tmp_path, edit, match):
  from safetensors.numpy import save_file
  tensors = hf.read_tensors(FIXTURE)
  edit(tensors)
  shutil.copy(os.path.join(FIXTURE, "config.json"), tmp_path / "config.json")
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match=match):
    hf.load(str(tmp_path))


def test_unsupported_model_type(tmp_path):
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"model_type": "llama"}, f)
  with pytest.raises(ValueError, match="model_type 'llama' is not supported"):
    hf.load(str(tmp_path))


def test_layers_under_scan_update_the_pools_in_place():
  """Stacked layers under `lax.scan` in one jit with the states donated: the compiled
  module aliases every state input to its output (no second copy of the pools)."""
  cfg, p = hf.load(FIXTURE, replay_mode="compact")
  mix = [lw.mixer for lw in p.layers]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *mix)
  states = jax.tree.map(lambda *a: jnp.stack(a), *hf.init_states(cfg, 2, jnp.float32))

  def run(stacked, states, x, row):
    def body(x, layer):
      params, state = layer
      out, state = layer_lib.mixer(cfg.mixer, params, state, x, row, backend="reference")
      return x + out, state
    return jax.lax.scan(body, x, (stacked, states))

  x = jnp.ones((2, 3, cfg.mixer.d_model), jnp.float32)
  row = jnp.zeros((2,), jnp.int32)
  compiled = jax.jit(run, donate_argnums=1).lower(stacked, states, x, row).compile()
  text = compiled.as_text()
  n_state = len(jax.tree.leaves(states))
  header = text[text.index("input_output_alias"):].split("\n", 1)[0]
  assert header.count("may-alias") + header.count("must-alias") >= n_state, header
  y, new_states = jax.jit(run, donate_argnums=1)(stacked, states, x, row)
  assert all(s.is_deleted() for s in jax.tree.leaves(states))
  assert np.all(np.isfinite(np.asarray(y)))
  assert np.asarray(new_states.pending).tolist() == [[3, 3], [3, 3]]


NEMOTRON = os.path.join(os.path.dirname(__file__), "fixtures", "hf_nemotron_h")


@pytest.mark.parametrize("mode", MODES)
def test_nemotron_h_prompt_with_its_dt_clamp(mode):
  """A Nemotron-H of two Mamba layers (transformers 5.24, time_step_min 0.3): the prompt's
  logits (transformers' multi-token path, dt clamped to time_step_min) through the loader
  and the layer; without the clamp they differ more (checked). transformers 5.24 cannot
  decode this model with its cache (a mask built from the cache asks for a sequence length
  that only attention layers keep), so its one-token path has no golden logits here: the
  next test checks the layer's one-row calls against the op without the clamp instead."""
  golden = np.load(os.path.join(NEMOTRON, "golden.npz"))
  cfg, p = hf.load(NEMOTRON, replay_mode=mode)
  assert cfg.model_type == "nemotron_h" and cfg.mamba_layers == (0, 1)
  assert cfg.mixer.ssm.dt_limit == (0.3, float("inf"))
  assert cfg.mixer.decode_dt_limit == (0.0, float("inf"))
  logits, _ = hf.forward(cfg, p, hf.init_states(cfg, 1), golden["prompt"][None], [0],
                         prefill=True, backend="reference")
  ours = rel(logits[0], golden["prompt_logits"])
  assert ours < 1e-5
  import dataclasses
  unclamped = dataclasses.replace(cfg, mixer=dataclasses.replace(
      cfg.mixer, ssm=cfg.mixer.ssm.replace(dt_limit=(0.0, float("inf")))))
  other, _ = hf.forward(unclamped, p, hf.init_states(cfg, 1), golden["prompt"][None], [0],
                        prefill=True, backend="reference")
  # (a random model's mixers move its logits little: the clamp shows as 25x the error)
  assert rel(other[0], golden["prompt_logits"]) > 5 * ours


@pytest.mark.parametrize("backend", matrix(["reference", "interpret"], keep={1}))
def test_one_row_calls_use_the_decode_dt_limit_and_replay_keeps_each_rows_limit(backend):
  """Nemotron-H: a prefill and verify calls of several rows clamp dt, one-row calls do not;
  compact mode replays every pending row with the dt its own call used, so both modes stay
  bitwise identical across the mix, and a one-row call equals the op run with (0, inf)."""
  cfg, p = hf.load(NEMOTRON)
  golden = np.load(os.path.join(NEMOTRON, "golden.npz"))
  rng = np.random.default_rng(1)
  calls = [(golden["prompt"][None], [0], True), (np.array([[5]]), [7], False),
           (np.array([[9]]), [0], False), (rng.integers(3, 64, (1, 4)), [0], False),
           (np.array([[11]]), [2], False), (rng.integers(3, 64, (1, 3)), [0], False)]
  outs = {}
  for mode in MODES:
    mcfg = dataclasses_replace_mode(cfg, mode)
    states, ys = hf.init_states(mcfg, 1), []
    for tokens, row, prefill in calls:
      logits, states = hf.forward(mcfg, p, states, tokens, np.asarray(row, np.int32),
                                  prefill=prefill, backend=backend)
      ys.append(np.asarray(logits))
    outs[mode] = ys
  for i, (a, b) in enumerate(zip(outs["snapshot"], outs["compact"])):
    np.testing.assert_array_equal(a, b, err_msg=f"call {i}")
  # The one-row call is the op with the decode limit: same logits as a model whose every
  # call runs unclamped would give only if the clamp mattered nowhere else; check directly.
  mcfg = dataclasses_replace_mode(cfg, "snapshot")
  st = hf.init_states(mcfg, 1)
  _, st = hf.forward(mcfg, p, st, golden["prompt"][None], [0], prefill=True, backend=backend)
  h = jnp.ones((1, 1, 64), jnp.float32)
  lw = p.layers[0].mixer
  a, _ = layer_lib.mixer(mcfg.mixer, lw, jax.tree.map(jnp.copy, st[0]), h, [7], backend=backend)
  import dataclasses
  plain = dataclasses.replace(mcfg.mixer, ssm=mcfg.mixer.ssm.replace(dt_limit=(0.0, float("inf"))),
                              decode_dt_limit=None)
  b, _ = layer_lib.mixer(plain, lw, jax.tree.map(jnp.copy, st[0]), h, [7], backend=backend)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def dataclasses_replace_mode(cfg, mode):
  import dataclasses
  return dataclasses.replace(cfg, mixer=dataclasses.replace(
      cfg.mixer, ssm=cfg.mixer.ssm.replace(replay_mode=mode)))


@pytest.mark.parametrize("change,match", [
    (dict(use_bias=True), "with a bias are not supported"),
    (dict(mamba_conv_bias=False), "a conv without bias is not supported"),
    (dict(mamba_num_heads=None), "'mamba_num_heads' is missing")])
def test_nemotron_h_config_errors(change, match):
  with open(os.path.join(NEMOTRON, "config.json")) as f:
    cfg = json.load(f)
  cfg.update(change)
  with pytest.raises(ValueError, match=match):
    hf.model_config(cfg)


def test_forward_and_mixer_reject_mismatched_arguments():
  cfg, p = hf.load(FIXTURE)
  with pytest.raises(ValueError, match=r"one pool per Mamba layer \(2\), got 1"):
    hf.forward(cfg, p, hf.init_states(cfg, 1)[:1], np.array([[3]]), [0])
  hidden = jnp.ones((1, 12, cfg.mixer.d_model), jnp.float32)
  with pytest.raises(ValueError, match=r"num_rows\[0\]=13: expected 1 <= num_rows <= R=12"):
    layer_lib.mixer(cfg.mixer, p.layers[0].mixer, hf.init_states(cfg, 1)[0], hidden, [0],
                    num_rows=[13], prefill=True)


@pytest.mark.parametrize("backend", matrix(["reference", "interpret"], keep={1}))
def test_ragged_prompts_through_the_model(backend):
  """Two prompts of 40 and 25 tokens in one ragged prefill (`num_rows`), then a decode step
  each: transformers' logits of the 40-token prompt, and of its first 25 tokens for the
  shorter one (a causal model's prefix); the shorter one's decode step as after a prefill of
  its 25 tokens alone. Then the two prompts packed (`cu_seqlens`)."""
  cfg, p = hf.load(FIXTURE, replay_mode="compact")
  states = hf.init_states(cfg, 2, jnp.float32)
  prompt = GOLDEN["prompt"]
  tokens = np.stack([prompt, np.concatenate([prompt[:25], np.zeros(15, prompt.dtype)])])
  logits, states = hf.forward(cfg, p, states, tokens, np.zeros(2, np.int32), prefill=True,
                              num_rows=np.array([40, 25], np.int32), backend=backend)
  assert rel(logits[0], GOLDEN["prompt_logits"]) < 1e-5
  assert rel(logits[1, :25], GOLDEN["prompt_logits"][:25]) < 1e-5
  tok = int(np.argmax(np.asarray(logits[0, -1])))
  assert tok == GOLDEN["tokens"][0]
  out, states = hf.forward(cfg, p, states, np.array([[tok], [tok]]),
                           np.array([cfg.mixer.ssm.capacity - 1, 7], np.int32), backend=backend)
  assert rel(out[0, 0], GOLDEN["step_logits"][1]) < 1e-5
  alone = hf.init_states(cfg, 1, jnp.float32)
  _, alone = hf.forward(cfg, p, alone, tokens[1:, :25], np.zeros(1, np.int32), prefill=True,
                        backend=backend)
  want, _ = hf.forward(cfg, p, alone, np.array([[tok]]), np.array([7], np.int32),
                       backend=backend)
  assert rel(out[1, 0], want[0, 0]) < 1e-5
  # The same prompts packed back to back (`cu_seqlens`): logits [T, V].
  packed, _ = hf.forward(cfg, p, hf.init_states(cfg, 2, jnp.float32),
                         np.concatenate([prompt, prompt[:25]]), 0,
                         cu_seqlens=np.array([0, 40, 65], np.int32), backend=backend)
  assert rel(packed[:40], GOLDEN["prompt_logits"]) < 1e-5
  assert rel(packed[40:], GOLDEN["prompt_logits"][:25]) < 1e-5


def test_sharded_checkpoint_reads_only_the_mamba_layers(tmp_path):
  """Shards listed in model.safetensors.index.json; a shard holding only tensors of other
  layers (as a hybrid model's attention weights) is not opened: here it is absent."""
  from safetensors.numpy import save_file
  tensors = hf.read_tensors(FIXTURE)
  with open(os.path.join(FIXTURE, "config.json")) as f:
    config = json.load(f)
  config["num_hidden_layers"] = 2
  parts = {"part-1.safetensors": {k: v for k, v in tensors.items() if ".layers.1." not in k},
           "part-2.safetensors": {k: v for k, v in tensors.items() if ".layers.1." in k},
           "part-3.safetensors": {"backbone.layers.9.attn.weight": np.zeros(3, np.float32)}}
  for name, part in parts.items():
    if name != "part-3.safetensors":
      save_file(part, str(tmp_path / name))
  weight_map = {k: name for name, part in parts.items() for k in part}
  with open(tmp_path / "model.safetensors.index.json", "w") as f:
    json.dump({"weight_map": weight_map}, f)
  with open(tmp_path / "config.json", "w") as f:
    json.dump(config, f)
  cfg, p = hf.load(str(tmp_path))
  _, want = hf.load(FIXTURE)
  for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_a_draft_tree_through_the_model(backend):
  """After the prompt, one verify call of a draft tree: the greedy token at the root, a wrong
  branch of three tokens, and the greedy continuation as a second branch. The root and the
  greedy branch give transformers' decode logits; the next call, from the branch's last row,
  gives the next step's logits."""
  cfg, p, states, logits = HFChecks._prefill(type("C", (), {"backend": backend})(), "snapshot")
  gold = GOLDEN["tokens"]
  assert int(np.argmax(logits[-1])) == gold[0] and cfg.mixer.ssm.capacity >= 7
  wrong = (gold[1:4] + 1) % GOLDEN["step_logits"].shape[-1]
  tokens = np.array([[gold[0], *wrong, *gold[1:4]]])
  parents = np.array([[-1, 0, 1, 2, 0, 4, 5]], np.int32)
  out, states = hf.forward(cfg, p, states, tokens, np.array([cfg.mixer.ssm.capacity - 1]),
                           parents=parents, backend=backend)
  for row, step in ((0, 1), (4, 2), (5, 3), (6, 4)):
    assert rel(out[0, row], GOLDEN["step_logits"][step]) < 1e-5, row
  assert rel(out[0, 1], GOLDEN["step_logits"][2]) > 1e-3          # the wrong branch differs
  out, _ = hf.forward(cfg, p, states, np.array([[gold[4]]]), np.array([6], np.int32),
                      backend=backend)
  assert rel(out[0, 0], GOLDEN["step_logits"][5]) < 1e-5

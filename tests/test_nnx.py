"""The Flax NNX module: the same outputs and states as `layer.mixer`."""

import jax.numpy as jnp
import numpy as np
import pytest

import m2v_jax as m
from tests.helpers import matrix, dev, HF_FIXTURE, assert_bitwise, copy_state, small_cfg

nnx = pytest.importorskip("flax.nnx", reason="the flax extra is not installed")
from m2v_jax import nnx as m2v_nnx  # noqa: E402


@pytest.mark.parametrize("mode", matrix(["snapshot", "compact"], keep={1}))
def test_module_matches_the_functional_layer(mode):
  """Random parameters from `nnx.Rngs`, a prefill then a verify through `nnx.jit`: out and
  the pool bitwise as `layer.mixer` with the module's parameters."""
  cfg = m.MixerConfig(ssm=small_cfg(mode=mode, headdim=16), d_model=24)
  mod = m2v_nnx.Mamba2Mixer(cfg, rngs=nnx.Rngs(params=3))
  assert len(nnx.state(mod, nnx.Param)) == 8
  p = mod.params()
  rng = np.random.default_rng(3)
  step = nnx.jit(lambda md, s, h, r: md(s, h, r, backend="interpret"), donate_argnums=1)
  s_mod = m.init_state(cfg.ssm, 2, jnp.float32)
  s_fun = copy_state(s_mod)
  rows = np.zeros(2, np.int32)
  for R in (5, 8):
    h = dev(rng.normal(size=(2, R, 24)), jnp.float32)
    out_m, s_mod = step(mod, s_mod, h, rows)
    out_f, s_fun = m.mixer(cfg, p, s_fun, h, rows, backend="interpret")
    assert_bitwise(out_m, out_f, f"out (R={R})")
    for name in type(s_mod)._fields:
      assert_bitwise(getattr(s_mod, name), getattr(s_fun, name), name)
    rows = np.array([3, 1], np.int32)


def test_module_from_a_hugging_face_checkpoint():
  """A layer of `hf.load` as a module: its parameters are the checkpoint's, its output the
  functional layer's; shapes of another config are rejected; params or rngs needed."""
  cfg, p = m.hf.load(HF_FIXTURE)
  layer = p.layers[0].mixer
  mod = m2v_nnx.Mamba2Mixer(cfg.mixer, layer)
  import jax
  for a, b in zip(jax.tree.leaves(mod.params()), jax.tree.leaves(layer), strict=True):
    assert_bitwise(a, b, "parameter")
  h = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, cfg.mixer.d_model)), jnp.float32)
  state = m.init_state(cfg.mixer.ssm, 1, jnp.float32)
  out_m, _ = mod(copy_state(state), h, [0], backend="reference")
  out_f, _ = m.mixer(cfg.mixer, layer, state, h, [0], backend="reference")
  assert_bitwise(out_m, out_f, "out")
  with pytest.raises(ValueError):
    m2v_nnx.Mamba2Mixer(m.MixerConfig(ssm=cfg.mixer.ssm, d_model=cfg.mixer.d_model + 8), layer)
  with pytest.raises(ValueError, match="give params or rngs"):
    m2v_nnx.Mamba2Mixer(cfg.mixer)

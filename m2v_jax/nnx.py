"""The mixer layer as a Flax NNX module (optional: `pip install "m2v_jax[flax]"`)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from m2v_jax import layer as layer_lib
from m2v_jax import params as params_lib

_SSM_FIELDS = params_lib.LayerParams._fields


class Mamba2Mixer(nnx.Module):
  """`layer.mixer` with its parameters as `nnx.Param`s.

  The state pool stays outside the module, passed in and returned as the functional ops
  pass it (one module serves any number of pools; the pool is donated as in `layer.mixer`).

  Args:
    cfg: the layer's `layer.MixerConfig`.
    params: its `layer.MixerParams` (e.g. a layer of `hf.load(...)[1].layers[i].mixer`);
      None draws `layer.random_mixer_params` from `rngs`.
    rngs: `nnx.Rngs` for random parameters (its `params` stream).
    weight_dtype: dtype of random projection weights.

  Raises:
    ValueError / TypeError: parameter shapes that do not match `cfg` (`layer.check_params`);
      ValueError when neither `params` nor `rngs` is given.
  """

  def __init__(self, cfg: layer_lib.MixerConfig, params: layer_lib.MixerParams | None = None,
               *, rngs: nnx.Rngs | None = None, weight_dtype=jnp.float32):
    if params is None:
      if rngs is None:
        raise ValueError("Mamba2Mixer: give params or rngs")
      params = layer_lib.random_mixer_params(cfg, rngs.params(), weight_dtype)
    layer_lib.check_params(cfg, params)
    self.cfg = cfg
    self.in_proj = nnx.Param(params.in_proj)
    self.norm_weight = nnx.Param(params.norm_weight)
    self.out_proj = nnx.Param(params.out_proj)
    for name in _SSM_FIELDS:                     # conv_weight, conv_bias, dt_bias, A_log, D
      setattr(self, name, nnx.Param(getattr(params.ssm, name)))

  def params(self) -> layer_lib.MixerParams:
    """The module's parameters as the functional `layer.MixerParams`."""
    ssm = params_lib.LayerParams(*(getattr(self, n)[...] for n in _SSM_FIELDS))
    return layer_lib.MixerParams(in_proj=self.in_proj[...], ssm=ssm,
                                 norm_weight=self.norm_weight[...], out_proj=self.out_proj[...])

  def __call__(self, state, hidden, state_row, **kwargs):
    """`layer.mixer(cfg, params, state, hidden, state_row, **kwargs)`: (out [B, R, d_model],
    new state)."""
    return layer_lib.mixer(self.cfg, self.params(), state, hidden, state_row, **kwargs)

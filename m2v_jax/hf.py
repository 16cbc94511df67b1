"""Hugging Face checkpoints: `Mamba2ForCausalLM` and the Mamba layers of Nemotron-H.

`load` reads `config.json` and safetensors (`pip install 'm2v_jax[hf]'`); `forward` runs a
model of Mamba layers through `layer.mixer`. Names and layouts: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from m2v_jax import config as config_lib
from m2v_jax import layer as layer_lib
from m2v_jax import params as params_lib
from m2v_jax import state as state_lib

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """What `forward` needs of a checkpoint's `config.json`: the Mamba layers' `MixerConfig`,
  sizes, the Mamba layer indices, norm epsilon, tied embeddings, "mamba2" or "nemotron_h".
  """

  mixer: layer_lib.MixerConfig
  vocab_size: int
  n_layers: int
  mamba_layers: tuple[int, ...]
  norm_eps: float
  tie_embeddings: bool
  model_type: str


class LayerWeights(NamedTuple):
  """One Mamba block: the RMSNorm before the mixer, and the mixer."""

  norm: jax.Array
  mixer: layer_lib.MixerParams


class ModelParams(NamedTuple):
  """Embeddings [V, D], the Mamba blocks in order, final norm [D], LM head [V, D]."""

  embeddings: jax.Array
  layers: tuple[LayerWeights, ...]
  norm_f: jax.Array
  lm_head: jax.Array


def model_config(hf: dict, *, capacity: int = 8, replay_mode: str = "snapshot",
                 window: int | None = None) -> ModelConfig:
  """`ModelConfig` from a parsed `config.json` ("mamba2" or "nemotron_h") and the verify options.

  Raises:
    ValueError: another model type, a missing key, projections with a bias, a conv without
      bias, an activation other than silu.
  """
  def key(*names, default=None):
    """The first of `names` present (transformers' aliases), else `default`, else ValueError."""
    for name in names:
      if name in hf and hf[name] is not None:
        return hf[name]
    if default is None:
      raise ValueError(f"config.json: {names[0]!r} is missing")
    return default

  kind = hf.get("model_type")
  if kind == "mamba2":
    H, P, N = key("num_heads"), key("head_dim"), key("state_size")
    G, K = key("n_groups"), key("conv_kernel")
    n_layers = key("num_hidden_layers")
    mamba_layers = tuple(range(n_layers))
    bias, act = key("use_bias", default=False), key("hidden_act", default="silu")
    conv_bias = key("use_conv_bias", default=True)
    lo, hi = (_number(v) for v in key("time_step_limit", default=(0.0, math.inf)))
    tied = key("tie_word_embeddings", default=False)
  elif kind == "nemotron_h":
    H, P, N = key("mamba_num_heads"), key("mamba_head_dim"), key("ssm_state_size")
    G, K = key("mamba_n_groups", "n_groups"), key("mamba_d_conv", "conv_kernel")
    # transformers >= 5: block types ("linear_attention" = Mamba); older: a pattern ("M").
    types = key("layers_block_type", "layer_types", "hybrid_override_pattern")
    n_layers = len(types)
    mamba_layers = tuple(i for i, t in enumerate(types) if t in ("M", "mamba", "linear_attention"))
    bias = key("use_bias", default=False) or key("mamba_proj_bias", default=False)
    act = key("mamba_hidden_act", default="silu")
    conv_bias = key("mamba_conv_bias", "use_conv_bias", default=True)
    lo, hi = _number(key("mamba_dt_min", "time_step_min", default=0.001)), math.inf
    tied = False                      # NemotronHForCausalLM never ties its LM head
  else:
    raise ValueError(f"config.json: model_type {kind!r} is not supported (mamba2, nemotron_h)")
  if bias:
    raise ValueError("config.json: in_proj/out_proj with a bias are not supported")
  if act != "silu":
    raise ValueError(f"config.json: the mixer's activation must be silu, got {act!r}")
  if not conv_bias:
    raise ValueError("config.json: a conv without bias is not supported")
  ssm = config_lib.Mamba2Config(
      nheads=H, headdim=P, dstate=N, ngroups=G, d_conv=K, capacity=capacity,
      replay_mode=replay_mode, window=window, dt_limit=(lo, hi))
  eps = float(hf.get("layer_norm_epsilon", 1e-5))
  # transformers' one-token decode path clamps no dt (in both models).
  decode = None if (lo, hi) == (0.0, math.inf) else (0.0, math.inf)
  mixer = layer_lib.MixerConfig(ssm=ssm, d_model=key("hidden_size"), norm_eps=eps,
                                decode_dt_limit=decode)
  return ModelConfig(mixer=mixer, vocab_size=key("vocab_size"), n_layers=n_layers,
                     mamba_layers=mamba_layers, norm_eps=eps, tie_embeddings=bool(tied),
                     model_type=kind)


def _number(v) -> float:
  """A config.json float: a number, `Infinity`, or transformers' `{"__float__": ...}`."""
  return float(v["__float__"]) if isinstance(v, dict) else float(v)


def read_tensors(path: str, keep=None) -> dict[str, np.ndarray]:
  """The tensors of a checkpoint directory (or one .safetensors file) as NumPy arrays.

  `keep`: optional predicate on names; shards with no kept tensor are not opened. Raises
  ImportError without safetensors, FileNotFoundError for a missing shard.
  """
  try:
    from safetensors import safe_open
  except ImportError as err:
    raise ImportError("reading Hugging Face checkpoints needs the safetensors package: "
                      "pip install 'm2v_jax[hf]'") from err
  keep = keep or (lambda name: True)
  if os.path.isfile(path):
    files, folder = [os.path.basename(path)], os.path.dirname(path)
  else:
    folder = path
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = sorted({file for name, file in weight_map.items() if keep(name)})
    else:
      files = ["model.safetensors"]
  out = {}
  for name in files:
    full = os.path.join(folder, name)
    if not os.path.exists(full):
      raise FileNotFoundError(f"{full}: checkpoint file missing")
    with safe_open(full, framework="np") as f:
      for key in f.keys():
        if keep(key):
          out[key] = f.get_tensor(key)
  return out


def _take(tensors, name, shape):
  if name not in tensors:
    raise ValueError(f"checkpoint: tensor {name!r} is missing")
  a = tensors[name]
  if tuple(a.shape) != tuple(shape):
    raise ValueError(f"checkpoint: {name} has shape {list(a.shape)}, expected {list(shape)}")
  return a


def mixer_params(cfg: layer_lib.MixerConfig, tensors: dict, prefix: str) -> layer_lib.MixerParams:
  """A mixer's parameters from the tensors `{prefix}.*`; ValueError names a bad one."""
  s = cfg.ssm
  t = lambda name, shape: _take(tensors, f"{prefix}.{name}", shape)
  for name in ("in_proj.bias", "out_proj.bias"):
    if f"{prefix}.{name}" in tensors:
      raise ValueError(f"checkpoint: {prefix}.{name}: projections with a bias are not supported")
  conv_w = t("conv1d.weight", (s.conv_dim, 1, s.d_conv))
  as32 = lambda a: jnp.asarray(np.asarray(a, np.float32))
  ssm = params_lib.LayerParams(
      conv_weight=as32(conv_w[:, 0, :]), conv_bias=as32(t("conv1d.bias", (s.conv_dim,))),
      dt_bias=as32(t("dt_bias", (s.nheads,))), A_log=as32(t("A_log", (s.nheads,))),
      D=as32(t("D", (s.nheads,))))
  return layer_lib.MixerParams(
      in_proj=jnp.asarray(t("in_proj.weight", (cfg.d_in_proj, cfg.d_model)).T),
      ssm=ssm,
      norm_weight=jnp.asarray(t("norm.weight", (cfg.d_inner,))),
      out_proj=jnp.asarray(t("out_proj.weight", (cfg.d_model, cfg.d_inner)).T))


def load(path: str, *, capacity: int = 8, replay_mode: str = "snapshot",
         window: int | None = None) -> tuple[ModelConfig, ModelParams]:
  """Reads a checkpoint directory (`config.json` and safetensors) with the verify options.

  Returns (ModelConfig, ModelParams); weights keep the checkpoint's dtype, SSM parameters are
  float32. Raises ValueError (unsupported configuration, missing or mis-shaped tensor) or
  FileNotFoundError.
  """
  with open(os.path.join(path, "config.json")) as f:
    cfg = model_config(json.load(f), capacity=capacity, replay_mode=replay_mode, window=window)
  wanted = ("backbone.embeddings.", "backbone.norm_f.", "lm_head.") + tuple(
      f"backbone.layers.{i}." for i in cfg.mamba_layers)
  tensors = read_tensors(path, keep=lambda name: name.startswith(wanted))
  D, V = cfg.mixer.d_model, cfg.vocab_size
  emb = _take(tensors, "backbone.embeddings.weight", (V, D))
  head = emb if cfg.tie_embeddings else tensors.get("lm_head.weight")
  if head is None:
    raise ValueError("checkpoint: tensor 'lm_head.weight' is missing (the config does not tie "
                     "it to the embeddings)")
  _take({"lm_head.weight": head}, "lm_head.weight", (V, D))
  layers = tuple(
      LayerWeights(norm=jnp.asarray(_take(tensors, f"backbone.layers.{i}.norm.weight", (D,))),
                   mixer=mixer_params(cfg.mixer, tensors, f"backbone.layers.{i}.mixer"))
      for i in cfg.mamba_layers)
  embeddings = jnp.asarray(emb)
  return cfg, ModelParams(embeddings=embeddings, layers=layers,
                          norm_f=jnp.asarray(_take(tensors, "backbone.norm_f.weight", (D,))),
                          lm_head=embeddings if cfg.tie_embeddings else jnp.asarray(head))


def rms_norm(x, weight, eps):
  """x / sqrt(mean(x²) + eps) * weight, float32."""
  x = x.astype(f32)
  return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight.astype(f32)


def init_states(cfg: ModelConfig, num_entries: int, dtype=jnp.float32, **kw):
  """One state pool per Mamba layer (`init_state` arguments in `kw`)."""
  return tuple(state_lib.init_state(cfg.mixer.ssm, num_entries, dtype, **kw)
               for _ in cfg.mamba_layers)


def forward(cfg: ModelConfig, params: ModelParams, states, tokens, state_row, *,
            num_rows=None, cache_indices=None, prefill: bool = False, chunked=None,
            cu_seqlens=None, parents=None, backend: str | None = None, dtype=jnp.float32):
  """Logits of R rows of each sequence through a model of Mamba layers only.

  Args:
    cfg, params: from `load`.
    states: one pool per Mamba layer (`init_states`).
    tokens: [B, R] int token ids.
    state_row, num_rows, cache_indices, parents: as `m2v_jax.verify` (with `prefill`,
      num_rows is each prompt's length; `parents`: a draft tree of `tokens`, verify only).
    prefill: `m2v_jax.prefill` (any R) instead of a verify call.
    cu_seqlens: [S+1] int32: prompts packed back to back in `tokens` [T]
      (`m2v_jax.prefill_packed`); logits [T, V].
    chunked, backend: as the ops.
    dtype: activation dtype of the mixers.

  Returns:
    (logits [B, R, V] float32, new states). Residual stream and RMSNorms are float32.

  Raises:
    ValueError: a model with layers other than Mamba layers, or a wrong number of states.
  """
  if cfg.mamba_layers != tuple(range(cfg.n_layers)):
    raise ValueError("forward: runs models of Mamba layers only; for a hybrid Nemotron-H, call "
                     "layer.mixer on its Mamba layers inside your own model")
  if len(states) != len(params.layers):
    raise ValueError(f"states: expected one pool per Mamba layer ({len(params.layers)}), got "
                     f"{len(states)}")
  x = params.embeddings[jnp.asarray(tokens)].astype(f32)
  new_states = []
  for lw, st in zip(params.layers, states):
    h = rms_norm(x, lw.norm, cfg.norm_eps).astype(dtype)
    out, st = layer_lib.mixer(cfg.mixer, lw.mixer, st, h, state_row, cache_indices=cache_indices,
                              num_rows=num_rows, prefill=prefill, chunked=chunked,
                              cu_seqlens=cu_seqlens, parents=parents, backend=backend)
    new_states.append(st)
    x = x + out.astype(f32)
  logits = layer_lib.project(rms_norm(x, params.norm_f, cfg.norm_eps), params.lm_head.T)
  return logits, tuple(new_states)

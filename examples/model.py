"""A small byte-level Mamba-2 language model whose mixers run through m2v_jax.

Each block: RMSNorm -> in_proj -> [z | xBC | dt] -> causal conv + SSM (m2v_jax) -> gated
RMSNorm (y * silu(z), normalized per group, as Nemotron-H does outside the SSM kernel) ->
out_proj -> residual: Hugging Face's `Mamba2ForCausalLM` with a tied embedding and LM head.
Training (`train.py`) runs the SSM in its chunked form (`m2v_jax.reference_ssd.ssd_chunked`)
on the parameter dict here; `save` writes the trained model as a Hugging Face checkpoint,
which decoding (`decode.py`) reads with `m2v_jax.hf.load` and runs through `m2v_jax.hf.forward`
(`m2v_jax.layer.mixer` per layer: `m2v_jax.prefill` and `m2v_jax.verify`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import m2v_jax as m2v
from m2v_jax import reference_ssd
from m2v_jax.kernels import rowmath

VOCAB = 256
EPS = 1e-5
HIGHEST = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes of the example model. `mixer` builds the m2v_jax layer config."""

  d_model: int = 192
  n_layer: int = 4
  nheads: int = 12
  headdim: int = 32
  dstate: int = 32
  ngroups: int = 2
  d_conv: int = 4

  def mixer(self, capacity: int = 8, replay_mode: str = "snapshot") -> m2v.Mamba2Config:
    return m2v.Mamba2Config(nheads=self.nheads, headdim=self.headdim, dstate=self.dstate,
                            ngroups=self.ngroups, d_conv=self.d_conv, capacity=capacity,
                            replay_mode=replay_mode)


def init_params(cfg: ModelConfig, seed: int = 0) -> dict:
  """Random initial parameters (Mamba-2 style dt, A and D initialization)."""
  mix = cfg.mixer()
  rng = np.random.default_rng(seed)
  d, di, C, H = cfg.d_model, mix.d_inner, mix.conv_dim, mix.nheads
  normal = lambda shape, std: jnp.asarray(rng.normal(0, std, shape), jnp.float32)
  layers = []
  for i in range(cfg.n_layer):
    lp = m2v.random_params(mix, seed * 100 + i)
    layers.append(dict(
        norm=jnp.ones((d,), jnp.float32),
        in_proj=normal((d, 2 * di + 2 * mix.ngroups * mix.dstate + H), d ** -0.5),
        conv_weight=lp.conv_weight, conv_bias=jnp.zeros((C,), jnp.float32),
        dt_bias=lp.dt_bias, A_log=lp.A_log, D=jnp.ones((H,), jnp.float32),
        gnorm=jnp.ones((di,), jnp.float32),
        out_proj=normal((di, d), di ** -0.5 / np.sqrt(2 * cfg.n_layer)),
    ))
  return dict(embed=normal((VOCAB, d), d ** -0.5), layers=layers,
              final_norm=jnp.ones((d,), jnp.float32))


def layer_params(lp: dict) -> m2v.LayerParams:
  return m2v.LayerParams(conv_weight=lp["conv_weight"], conv_bias=lp["conv_bias"],
                         dt_bias=lp["dt_bias"], A_log=lp["A_log"], D=lp["D"])


def rms_norm(x, w):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def gated_rms_norm(y, z, w, ngroups):
  """RMSNorm(y * silu(z)) over groups of d_inner / ngroups channels (norm_before_gate=False)."""
  g = y * rowmath.silu(z)
  shape = g.shape
  g = g.reshape(shape[:-1] + (ngroups, shape[-1] // ngroups))
  g = g * jax.lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + EPS)
  return g.reshape(shape) * w


def _split(cfg: ModelConfig, zxd):
  mix = cfg.mixer()
  di, C = mix.d_inner, mix.conv_dim
  return zxd[..., :di], zxd[..., di:di + C], zxd[..., di + C:]


def forward_train(cfg: ModelConfig, params: dict, tokens, chunk: int = 64):
  """Logits [B, T, 256] of a whole sequence from the zero state (chunked SSD mixer)."""
  mix = cfg.mixer()
  x = params["embed"][tokens]
  Bsz = tokens.shape[0]
  zero_ssm = jnp.zeros((Bsz, mix.nheads, mix.headdim, mix.dstate), jnp.float32)
  zero_conv = jnp.zeros((Bsz, mix.conv_dim, mix.d_conv - 1), jnp.float32)
  for lp in params["layers"]:
    zxd = jnp.dot(rms_norm(x, lp["norm"]), lp["in_proj"], precision=HIGHEST)
    z, xbc, dt = _split(cfg, zxd)
    y, _, _ = reference_ssd.ssd_chunked(mix, layer_params(lp), zero_ssm, zero_conv, xbc, dt,
                                    chunk=chunk)
    y = gated_rms_norm(y, z, lp["gnorm"], mix.ngroups)
    x = x + jnp.dot(y, lp["out_proj"], precision=HIGHEST)
  return jnp.dot(rms_norm(x, params["final_norm"]), params["embed"].T, precision=HIGHEST)


def hf_config(cfg: ModelConfig) -> dict:
  """The model's `config.json` as Hugging Face's `Mamba2ForCausalLM` spells it (tied LM head)."""
  mix = cfg.mixer()
  return dict(model_type="mamba2", architectures=["Mamba2ForCausalLM"], vocab_size=VOCAB,
              hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer, num_heads=cfg.nheads,
              head_dim=cfg.headdim, expand=mix.d_inner // cfg.d_model, state_size=cfg.dstate,
              n_groups=cfg.ngroups, conv_kernel=cfg.d_conv, layer_norm_epsilon=EPS,
              use_bias=False, use_conv_bias=True, hidden_act="silu", residual_in_fp32=True,
              tie_word_embeddings=True, time_step_limit=[0.0, float("inf")], rms_norm=True)


def save(path: str, cfg: ModelConfig, params: dict, meta: dict) -> None:
  """Writes the model as a Hugging Face Mamba2 checkpoint directory: config.json and
  model.safetensors (weights in their dtype, names and layouts of `Mamba2ForCausalLM`), plus
  the training notes in m2v_meta.json. `m2v_jax.hf.load` reads it."""
  from safetensors.numpy import save_file
  mix = cfg.mixer()
  t = {"backbone.embeddings.weight": params["embed"], "backbone.norm_f.weight": params["final_norm"]}
  for i, lp in enumerate(params["layers"]):
    pre = f"backbone.layers.{i}"
    t[f"{pre}.norm.weight"] = lp["norm"]
    t[f"{pre}.mixer.in_proj.weight"] = lp["in_proj"].T
    t[f"{pre}.mixer.conv1d.weight"] = lp["conv_weight"].reshape(mix.conv_dim, 1, mix.d_conv)
    for name in ("dt_bias", "A_log", "D"):
      t[f"{pre}.mixer.{name}"] = lp[name]
    t[f"{pre}.mixer.conv1d.bias"] = lp["conv_bias"]
    t[f"{pre}.mixer.norm.weight"] = lp["gnorm"]
    t[f"{pre}.mixer.out_proj.weight"] = lp["out_proj"].T
  os.makedirs(path, exist_ok=True)
  save_file({k: np.ascontiguousarray(np.asarray(v)) for k, v in t.items()},
            os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config(cfg), f, indent=1)
  with open(os.path.join(path, "m2v_meta.json"), "w") as f:
    json.dump(meta, f, indent=1)


def load_meta(path: str) -> dict:
  with open(os.path.join(path, "m2v_meta.json")) as f:
    return json.load(f)

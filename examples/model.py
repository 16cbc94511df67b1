"""A small byte-level Mamba-2 language model whose mixers run through m2v_jax.

Each block: RMSNorm -> in_proj -> [z | xBC | dt] -> causal conv + SSM (m2v_jax) -> gated
RMSNorm (y * silu(z), normalized per group, as Nemotron-H does outside the SSM kernel) ->
out_proj -> residual. Embedding and LM head are tied. Training runs the SSM in its chunked
form (`m2v_jax.reference_ssd.ssd_chunked`); decoding runs it through `m2v_jax.prefill` and
`m2v_jax.verify` with a state per layer.
"""

from __future__ import annotations

import dataclasses
import json

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


def step(cfg: ModelConfig, mix: m2v.Mamba2Config, params: dict, states: list, tokens, state_row,
         num_rows=None, *, prefill: bool = False, backend: str | None = None):
  """One decoding call: R rows through every layer. Returns (logits [B, R, 256], states).

  Args:
    cfg, mix: model and mixer configs (`mix.replay_mode` selects the mode).
    params: model parameters.
    states: one m2v_jax state pool per layer.
    tokens: [B, R] int32 byte tokens (the last committed token, then drafts).
    state_row: [B] int32, the last accepted row of the previous call.
    num_rows: optional [B] int32, rows that count (verify calls only).
    prefill: use `m2v_jax.prefill` (any R) instead of `m2v_jax.verify` (R <= capacity).
    backend: m2v_jax backend (None: automatic).
  """
  x = params["embed"][tokens]
  new_states = []
  for lp, st in zip(params["layers"], states):
    zxd = jnp.dot(rms_norm(x, lp["norm"]), lp["in_proj"], precision=HIGHEST)
    z, xbc, dt = _split(cfg, zxd)
    if prefill:
      y, st = m2v.prefill(mix, layer_params(lp), st, xbc, dt, state_row, backend=backend)
    else:
      y, st = m2v.verify(mix, layer_params(lp), st, xbc, dt, state_row, num_rows=num_rows,
                         backend=backend)
    new_states.append(st)
    y = gated_rms_norm(y, z, lp["gnorm"], mix.ngroups)
    x = x + jnp.dot(y, lp["out_proj"], precision=HIGHEST)
  logits = jnp.dot(rms_norm(x, params["final_norm"]), params["embed"].T, precision=HIGHEST)
  return logits, new_states


def save(path: str, cfg: ModelConfig, params: dict, meta: dict) -> None:
  flat = {"embed": params["embed"], "final_norm": params["final_norm"]}
  for i, lp in enumerate(params["layers"]):
    for k, v in lp.items():
      flat[f"layers.{i}.{k}"] = v
  np.savez_compressed(path, config=json.dumps(dataclasses.asdict(cfg)), meta=json.dumps(meta),
                      **{k: np.asarray(v) for k, v in flat.items()})


def load(path: str) -> tuple[ModelConfig, dict, dict]:
  with np.load(path) as f:
    cfg = ModelConfig(**json.loads(str(f["config"])))
    meta = json.loads(str(f["meta"]))
    layers = [{k.split(".", 2)[2]: jnp.asarray(f[k]) for k in f.files
               if k.startswith(f"layers.{i}.")} for i in range(cfg.n_layer)]
    params = dict(embed=jnp.asarray(f["embed"]), final_norm=jnp.asarray(f["final_norm"]),
                  layers=layers)
  return cfg, params, meta

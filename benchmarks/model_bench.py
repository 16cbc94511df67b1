"""Model-level decode speed: a stack of Mamba-2 layers with their projections, decoded greedily
one token a call and speculatively R rows a call, in snapshot and compact mode.

The model is `m2v_jax.hf.ModelParams` with random weights (bfloat16 projections, as served;
float32 SSM parameters) at a layer geometry (default Bolt: d_model 4096, 128 heads x 64 x 128,
8 groups), run through `m2v_jax.hf.forward` in one jitted step per call with every layer's
state donated. Speculative steps follow a fixed acceptance schedule (the benchmarks' mix: a
draft is accepted with probability 0.78 while every earlier one was), the same in both modes,
and each step produces (accepted drafts + 1) tokens; the logits of the rows a step keeps are
compared bitwise between the modes. Tokens per second per sequence-batch are the median over
`--repeats` interleaved runs, with the range.

    python benchmarks/model_bench.py --batches=1,8,32,64 --layers=8 --out=/tmp/model.json
    python benchmarks/model_bench.py --geometry=small --batches=2 --steps=4   # CPU smoke run
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from m2v_jax import config as config_lib
from m2v_jax import hf
from m2v_jax import layer as layer_lib

flags.DEFINE_list("batches", ["1", "8", "32", "64"], "batch sizes")
flags.DEFINE_integer("layers", 8, "Mamba layers")
flags.DEFINE_integer("rows", 8, "rows of a speculative call (last token + drafts)")
flags.DEFINE_integer("steps", 32, "decode calls per timed run")
flags.DEFINE_integer("repeats", 3, "timed runs per variant, interleaved")
flags.DEFINE_integer("vocab", 8192, "vocabulary size")
flags.DEFINE_enum("geometry", "bolt", ["bolt", "small"], "layer geometry")
flags.DEFINE_string("backend", None, "m2v_jax backend (default: pallas on a GPU)")
flags.DEFINE_string("out", None, "write the results as JSON here")
FLAGS = flags.FLAGS

ACCEPT_PROB = 0.78


def geometry(name: str) -> tuple[config_lib.Mamba2Config, int]:
  """(SSM config, d_model) of the `--geometry` flag's value: "bolt", or "small" for a CPU run."""
  if name == "bolt":
    return config_lib.BOLT, 4096
  return config_lib.Mamba2Config(nheads=8, headdim=16, dstate=32, ngroups=2), 64


def random_model(ssm: config_lib.Mamba2Config, d_model: int, layers: int, vocab: int,
                 rows: int, mode: str) -> tuple[hf.ModelConfig, hf.ModelParams]:
  """A random model of `layers` Mamba layers (bfloat16 projections and embeddings)."""
  ssm = ssm.replace(capacity=rows, replay_mode=mode)
  mixer = layer_lib.MixerConfig(ssm=ssm, d_model=d_model)
  cfg = hf.ModelConfig(mixer=mixer, vocab_size=vocab, n_layers=layers,
                       mamba_layers=tuple(range(layers)), norm_eps=1e-5, tie_embeddings=True,
                       model_type="mamba2")
  blocks = tuple(hf.LayerWeights(
      norm=jnp.ones((d_model,), jnp.bfloat16),
      mixer=layer_lib.random_mixer_params(mixer, i, jnp.bfloat16, 1 / np.sqrt(2 * layers)))
      for i in range(layers))
  emb = jnp.asarray(np.random.default_rng(0).normal(0, 1, (vocab, d_model)), jnp.bfloat16)
  return cfg, hf.ModelParams(embeddings=emb, layers=blocks,
                             norm_f=jnp.ones((d_model,), jnp.bfloat16), lm_head=emb)


def schedule(steps: int, B: int, R: int, seed: int = 0) -> np.ndarray:
  """Accepted drafts [steps, B] of each speculative call (0 ... R-1)."""
  rng = np.random.default_rng(seed)
  return np.minimum(rng.geometric(1 - ACCEPT_PROB, (steps, B)) - 1, R - 1).astype(np.int32)


def decoder(cfg, params, B, R, backend):
  """A jitted call: (states, tokens [B, R], state_row [B]) -> (logits, states)."""
  def step(params, states, tokens, state_row):
    logits, states = hf.forward(cfg, params, states, tokens, state_row, backend=backend,
                                dtype=jnp.bfloat16)
    return logits, states
  return jax.jit(step, donate_argnums=(1,))


def run(cfg, params, fn, B, R, accepted, keep_logits=False):
  """Decodes len(accepted) calls of R rows with the jitted `fn` (`decoder`); returns
  (seconds, tokens produced, kept logits)."""
  states = hf.init_states(cfg, B, jnp.bfloat16, conv_dtype=jnp.bfloat16)
  rng = np.random.default_rng(1)
  toks = [jnp.asarray(rng.integers(0, cfg.vocab_size, (B, R)), jnp.int32)
          for _ in range(len(accepted))]
  rows = [jnp.zeros((B,), jnp.int32)] + [jnp.asarray(a) for a in accepted[:-1]]
  logits, states = fn(params, states, toks[0], rows[0])            # compile and warm
  jax.block_until_ready(logits)
  states = hf.init_states(cfg, B, jnp.bfloat16, conv_dtype=jnp.bfloat16)
  kept = []
  t0 = time.perf_counter()
  for t in range(len(accepted)):
    logits, states = fn(params, states, toks[t], rows[t])
    if keep_logits:
      kept.append(logits)
  jax.block_until_ready((logits, states))
  seconds = time.perf_counter() - t0
  produced = int(np.sum(accepted + 1)) if R > 1 else len(accepted) * B
  return seconds, produced, [np.asarray(k) for k in kept]


def main(_):
  backend = config_lib.resolve_backend(FLAGS.backend)
  ssm, d_model = geometry(FLAGS.geometry)
  R, steps = FLAGS.rows, FLAGS.steps
  dev = jax.devices()[0]
  results = dict(meta=dict(date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), device=dev.device_kind,
                           jax=jax.__version__, backend=backend, layers=FLAGS.layers,
                           geometry=FLAGS.geometry, rows=R, steps=steps,
                           accept_prob=ACCEPT_PROB), rows=[])
  for B in (int(b) for b in FLAGS.batches):
    accepted = schedule(steps, B, R)
    variants = {}
    for mode in ("snapshot", "compact"):
      cfg, params = random_model(ssm, d_model, FLAGS.layers, FLAGS.vocab, R, mode)
      variants[f"{mode} R={R}"] = (cfg, params, decoder(cfg, params, B, R, backend), R,
                                   accepted)
    cfg1, params1 = random_model(ssm, d_model, FLAGS.layers, FLAGS.vocab, 1, "snapshot")
    variants["greedy R=1"] = (cfg1, params1, decoder(cfg1, params1, B, 1, backend), 1,
                              np.zeros((steps, B), np.int32))
    # Both modes produce bitwise the same logits on the same schedule.
    kept = {m: run(*variants[f"{m} R={R}"][:3], B, R, accepted, keep_logits=True)[2]
            for m in ("snapshot", "compact")}
    same = all(np.array_equal(a, b) for a, b in zip(kept["snapshot"], kept["compact"]))
    times = {name: [] for name in variants}
    for _ in range(FLAGS.repeats):
      for name, (cfg, params, fn, r, acc) in variants.items():
        sec, produced, _ = run(cfg, params, fn, B, r, acc)
        times[name].append(produced / sec)
    for name, tps in times.items():
      row = dict(name=f"model B={B} {name} layers={FLAGS.layers} {backend}",
                 tokens_per_s_median=statistics.median(tps), tokens_per_s_min=min(tps),
                 tokens_per_s_max=max(tps), modes_bitwise_equal=same,
                 mean_tokens_per_call=float(np.mean(variants[name][4] + 1)) if "R=1" not in name
                 else 1.0)
      results["rows"].append(row)
      print(f"{row['name']}: {row['tokens_per_s_median']:.0f} tokens/s "
            f"({row['tokens_per_s_min']:.0f}-{row['tokens_per_s_max']:.0f}), "
            f"{row['mean_tokens_per_call']:.2f} tokens a call; modes equal: {same}", flush=True)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)

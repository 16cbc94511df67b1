"""Trains the example byte-level Mamba-2 model on the Python standard library's source.

Every machine with Python has this text offline. Files are taken in sorted order; one file in
twenty is held out for validation. Writes the weights (float16) as a Hugging Face Mamba2
checkpoint directory (config.json, model.safetensors) that `decode.py` loads.

    .venv/bin/python examples/train.py --steps=1500 --out=examples/weights/mamba2_stdlib

Needs optax (`pip install -e '.[train]'`).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as model_lib  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 1500, "optimizer steps")
flags.DEFINE_integer("batch", 16, "sequences per step")
flags.DEFINE_integer("seq_len", 256, "bytes per sequence")
flags.DEFINE_float("lr", 3e-3, "peak learning rate")
flags.DEFINE_integer("seed", 0, "seed")
flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights",
                                        "mamba2_stdlib"), "output checkpoint directory")


def corpus() -> tuple[np.ndarray, np.ndarray, list[str]]:
  """(train bytes, validation bytes, file names) from the stdlib's top-level .py files."""
  root = sysconfig.get_paths()["stdlib"]
  names = sorted(f for f in os.listdir(root) if f.endswith(".py"))
  train, val = [], []
  for i, name in enumerate(names):
    with open(os.path.join(root, name), "rb") as fh:
      data = fh.read()
    (val if i % 20 == 7 else train).append(data)
  cat = lambda parts: np.frombuffer(b"\n\n".join(parts), np.uint8)
  return cat(train), cat(val), names


def main(argv):
  del argv
  train, val, names = corpus()
  print(f"corpus: {len(names)} files, {len(train) / 1e6:.2f} MB train, {len(val) / 1e6:.2f} MB val")
  cfg = model_lib.ModelConfig()
  params = model_lib.init_params(cfg, FLAGS.seed)
  n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  print(f"model: {cfg}, {n_params / 1e6:.2f} M parameters")
  warmup = min(100, FLAGS.steps // 10)
  sched = optax.warmup_cosine_decay_schedule(0.0, FLAGS.lr, warmup, FLAGS.steps, FLAGS.lr / 20)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.05))
  opt_state = opt.init(params)

  def loss_fn(p, batch):
    logits = model_lib.forward_train(cfg, p, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

  @jax.jit
  def train_step(p, s, batch):
    loss, grads = jax.value_and_grad(loss_fn)(p, batch)
    updates, s = opt.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss

  eval_loss = jax.jit(loss_fn)
  rng = np.random.default_rng(FLAGS.seed)
  T = FLAGS.seq_len + 1

  def sample(data, n):
    starts = rng.integers(0, len(data) - T, n)
    return jnp.asarray(np.stack([data[s:s + T] for s in starts]).astype(np.int32))

  val_batch = sample(val, 64)
  t0 = time.time()
  for i in range(1, FLAGS.steps + 1):
    params, opt_state, loss = train_step(params, opt_state, sample(train, FLAGS.batch))
    if i % 100 == 0 or i == 1:
      vl = float(eval_loss(params, val_batch))
      print(f"step {i:5d}  train {float(loss) / np.log(2):.3f}  val {vl / np.log(2):.3f} "
            f"bits/byte  {time.time() - t0:.0f} s", flush=True)
  vl = float(eval_loss(params, val_batch)) / np.log(2)
  half = jax.tree.map(lambda a: a.astype(jnp.float16), params)
  model_lib.save(FLAGS.out, cfg, half, dict(steps=FLAGS.steps, val_bits_per_byte=round(vl, 4),
                                            corpus="python stdlib top-level .py files",
                                            python=sys.version.split()[0]))
  size = os.path.getsize(os.path.join(FLAGS.out, "model.safetensors"))
  print(f"saved {FLAGS.out} ({size / 1e6:.2f} MB), val {vl:.3f} bits/byte")


if __name__ == "__main__":
  app.run(main)

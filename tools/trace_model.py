"""Device time of one speculative decode call of `benchmarks/model_bench.py`'s model, by kernel.

Traces a few jitted calls (every layer, the projections and the LM head) with `jax.profiler`
and sums each kernel's device time per call, so the Mamba kernels' share of a model step can
be read beside everything else:

    PYTHONPATH=. python tools/trace_model.py --mode=compact --batch=32
"""

from __future__ import annotations

import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import model_bench  # noqa: E402
from m2v_jax import config as config_lib, hf  # noqa: E402
from tools import trace_call  # noqa: E402

FLAGS = flags.FLAGS
# model_bench's flags (rows, layers, vocab, geometry, backend) apply too.
flags.DEFINE_enum("mode", "compact", ["snapshot", "compact"], "replay mode")
flags.DEFINE_integer("batch", 32, "sequences B")
flags.DEFINE_integer("calls", 4, "traced calls")
flags.DEFINE_integer("show", 14, "kernels printed, by device time")


def main(argv):
  del argv
  backend = config_lib.resolve_backend(FLAGS.backend)
  ssm, d_model = model_bench.geometry(FLAGS.geometry)
  B, R, K = FLAGS.batch, FLAGS.rows, FLAGS.calls
  cfg, params = model_bench.random_model(ssm, d_model, FLAGS.layers, FLAGS.vocab, R,
                                         FLAGS.mode)
  fn = model_bench.decoder(cfg, params, B, R, backend)
  states = hf.init_states(cfg, B, jnp.bfloat16, conv_dtype=jnp.bfloat16)
  rng = np.random.default_rng(0)
  toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, R)), jnp.int32)
  rows = jnp.asarray(model_bench.schedule(1, B, R)[0])
  for r in (jnp.zeros_like(rows), rows, rows):     # compile and warm; a fresh entry starts at 0
    logits, states = fn(params, states, toks, r)
  assert bool(jnp.all(jnp.isfinite(logits))), "a sequence was rejected: its logits are NaN"
  trace_dir = tempfile.mkdtemp(prefix="m2v_trace_model_")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(K):
      logits, states = fn(params, states, toks, rows)
    jax.block_until_ready((logits, states))
  events = trace_call.device_events(trace_dir)
  busy = trace_call.busy_by_kernel(events, 60)
  span = (events[-1][1] + events[-1][2] - events[0][1]) if events else 0.0
  print(f"model {FLAGS.mode} B={B} R={R} layers={FLAGS.layers} on {backend}: per call span "
        f"{span / K:.1f} µs, device busy {sum(busy.values()) / K:.1f} µs ({trace_dir})")
  print("| kernel | µs per call | per layer |\n|---|---|---|")
  for name, total in busy.most_common(FLAGS.show):
    print(f"| {name} | {total / K:.1f} | {total / K / FLAGS.layers:.1f} |")


if __name__ == "__main__":
  app.run(main)

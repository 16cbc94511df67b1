"""Speculative decoding of the example Mamba-2 model through m2v_jax's verify op.

Prefills the prompt, then decodes greedily: each step verifies R rows (the last token plus up
to R-1 drafts found by prompt lookup, an n-gram match in the text so far) in one call per
layer, and the next step starts from `state_row` = the last accepted row. It prints the text
as it is generated, then the acceptance rate and speeds, and checks that

* the speculative output is token for token the plain greedy output (one token per call), and
* (with --compare_modes) snapshot and compact replay produce the same tokens and the same
  acceptance counts.

Any mismatch ends the program with exit status 1.

    .venv/bin/python examples/decode.py --prompt="def main(" --max_new_tokens=300

Both decoders call the same jitted step with R rows; the greedy one marks a single row live
(`num_rows=1`), so the dense layers see the same shapes and round alike in both.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as model_lib  # noqa: E402

import m2v_jax as m2v  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROMPT = '''import os
import sys


def read_lines(path):
    """Return the lines of the file at path."""
    with open(path) as f:
        return f.read().splitlines()


def main(argv):
    '''

FLAGS = flags.FLAGS
flags.DEFINE_string("weights", os.path.join(HERE, "weights", "mamba2_stdlib.npz"), "model .npz")
flags.DEFINE_string("prompt", DEFAULT_PROMPT, "prompt text")
flags.DEFINE_string("prompt_file", None, "read the prompt from this file instead")
flags.DEFINE_integer("max_new_tokens", 256, "bytes to generate")
flags.DEFINE_integer("rows", 8, "rows per verify call (last token + rows-1 drafts); the "
                     "state capacity S = W")
flags.DEFINE_integer("ngram", 3, "longest n-gram the prompt-lookup drafter matches")
flags.DEFINE_string("replay_mode", "snapshot", "snapshot | compact (ORT: 0 | 1)")
flags.DEFINE_bool("compare_modes", True, "also decode in the other mode and compare")
flags.DEFINE_string("backend", None, "m2v_jax backend (default: pallas on GPU, else reference)")
flags.DEFINE_bool("quiet", False, "do not stream the generated text")
flags.DEFINE_integer("abba_prompts", 0, "after the checks, time both modes on this many "
                     "built-in prompts in ABBA order and print tokens/s per mode")

# Prompts for --abba_prompts: openings of code in the style of the training text.
ABBA_PROMPTS = [
    DEFAULT_PROMPT,
    "class Queue:\n    \"\"\"A first-in, first-out queue.\"\"\"\n\n    def __init__(self, maxsize=0):\n        self.maxsize = maxsize\n",
    "def _parse_args(args):\n    result = {}\n    for arg in args:\n        if arg.startswith('--'):\n",
    "import re\n\n_pattern = re.compile(r'\\s+')\n\n\ndef split_words(text):\n",
]


def lookup_drafts(tokens: bytes, k: int, max_ngram: int) -> bytes:
  """Up to k draft bytes: what followed the latest earlier occurrence of the longest suffix
  n-gram (n = max_ngram ... 1) of `tokens`."""
  for n in range(max_ngram, 0, -1):
    if len(tokens) <= n:
      continue
    at = tokens.rfind(tokens[-n:], 0, len(tokens) - 1)
    if at >= 0:
      follow = tokens[at + n:at + n + k]
      if follow:
        return follow
  return b""


class Decoder:
  """Holds the compiled prefill and verify steps of one mode."""

  def __init__(self, cfg, params, mode: str, rows: int, backend):
    self.cfg, self.params, self.R = cfg, params, rows
    self.mix = cfg.mixer(capacity=rows, replay_mode=mode)
    self.backend = backend
    mk = lambda prefill: jax.jit(functools.partial(model_lib.step, cfg, self.mix, prefill=prefill,
                                                   backend=backend), donate_argnums=(1,))
    self._prefill_jit, self._verify_jit = mk(True), mk(False)
    self._prefill, self._verify = self._prefill_jit, self._verify_jit

  def fresh_states(self):
    return [m2v.init_state(self.mix, 1, jnp.float32) for _ in range(self.cfg.n_layer)]

  def compile(self, prompt_len: int):
    """Compiles both steps ahead of time so that timings exclude compilation."""
    states = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.fresh_states())
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    self._prefill = self._prefill_jit.lower(self.params, states, i32(1, prompt_len),
                                            i32(1)).compile()
    self._verify = self._verify_jit.lower(self.params, states, i32(1, self.R), i32(1),
                                          i32(1)).compile()

  def prefill(self, prompt: bytes):
    states = self.fresh_states()
    toks = jnp.asarray(np.frombuffer(prompt, np.uint8).astype(np.int32)[None])
    logits, states = self._prefill(self.params, states, toks, jnp.zeros((1,), jnp.int32))
    first = int(jnp.argmax(logits[0, -1]))
    return first, states, min(len(prompt), self.R) - 1

  def run(self, prompt: bytes, max_new: int, speculative: bool, ngram: int, stream=None):
    """Decodes max_new bytes. Returns (generated bytes, accepted drafts per call, seconds,
    prefill seconds, drafts proposed per call)."""
    t0 = time.perf_counter()
    nxt, states, row = self.prefill(prompt)
    t_prefill = time.perf_counter() - t0
    text, out, accepted, proposed = bytearray(prompt), bytearray(), [], []
    t0 = time.perf_counter()
    while len(out) < max_new:
      text.append(nxt)
      out.append(nxt)
      if stream:
        stream(bytes([nxt]))
      if len(out) >= max_new:
        break
      drafts = lookup_drafts(bytes(text), self.R - 1, ngram) if speculative else b""
      toks = np.zeros((1, self.R), np.int32)
      toks[0, 0] = nxt
      toks[0, 1:1 + len(drafts)] = np.frombuffer(drafts, np.uint8)
      n = 1 + len(drafts)
      logits, states = self._verify(self.params, states, jnp.asarray(toks),
                                    jnp.asarray([row], jnp.int32), jnp.asarray([n], jnp.int32))
      preds = np.asarray(jnp.argmax(logits[0, :n], axis=-1))
      k = 0
      while k < len(drafts) and drafts[k] == preds[k]:
        k += 1
      accepted.append(k)
      proposed.append(len(drafts))
      new = bytes(drafts[:k])
      text.extend(new)
      out.extend(new)
      if stream and new:
        stream(new)
      nxt, row = int(preds[k]), k
    return bytes(out[:max_new]), accepted, time.perf_counter() - t0, t_prefill, proposed


def main(argv):
  del argv
  cfg, params, meta = model_lib.load(FLAGS.weights)
  params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
  if FLAGS.prompt_file:
    with open(FLAGS.prompt_file, "rb") as fh:
      prompt = fh.read()
  else:
    prompt = FLAGS.prompt.encode()
  mode = m2v.parse_replay_mode(FLAGS.replay_mode)
  backend = m2v.resolve_backend(FLAGS.backend)
  dev = jax.devices()[0]
  print(f"model: {meta}\ndevice: {dev.device_kind} ({dev.platform}), m2v_jax backend: "
        f"{backend}, mode: {mode}, rows per call: {FLAGS.rows}, prompt: {len(prompt)} bytes\n")
  modes = [mode] + ([m for m in ("snapshot", "compact") if m != mode] if FLAGS.compare_modes else [])
  decoders = {m: Decoder(cfg, params, m, FLAGS.rows, FLAGS.backend) for m in modes}
  for d in decoders.values():
    d.compile(len(prompt))

  def stream(b):
    sys.stdout.buffer.write(b)
    sys.stdout.flush()

  for d in decoders.values():             # warm-up: first executions allocate and load
    d.run(prompt, 8, True, FLAGS.ngram)
    d.run(prompt, 8, False, FLAGS.ngram)
  if not FLAGS.quiet:            # shown once, in a run of its own: printing is not timed
    sys.stdout.buffer.write(prompt)
    decoders[mode].run(prompt, FLAGS.max_new_tokens, True, FLAGS.ngram, stream=stream)
  results = {m: decoders[m].run(prompt, FLAGS.max_new_tokens, True, FLAGS.ngram)
             for m in modes}
  greedy = decoders[mode].run(prompt, FLAGS.max_new_tokens, False, FLAGS.ngram)
  print("\n")

  ok = True
  spec, acc, secs, pre, drafts = results[mode]
  proposed = sum(drafts)
  print(f"prefill: {len(prompt)} tokens in {pre * 1e3:.1f} ms ({len(prompt) / pre:.0f} tokens/s)")
  for m in modes:
    out, a, s = results[m][:3]
    print(f"speculative [{m}]: {len(out)} tokens in {len(a)} verify calls, "
          f"{len(out) / s:.1f} tokens/s, mean {len(out) / max(len(a), 1):.2f} tokens per call")
  print(f"greedy [{mode}]: {len(greedy[0])} tokens in {len(greedy[1])} calls, "
        f"{len(greedy[0]) / greedy[2]:.1f} tokens/s")
  print(f"acceptance: {sum(acc)} of {proposed} draft rows accepted "
        f"({sum(acc) / max(proposed, 1):.1%}); speed-up over greedy "
        f"{(len(spec) / secs) / (len(greedy[0]) / greedy[2]):.2f}x")
  if spec != greedy[0]:
    ok = False
    first = next(i for i, (a, b) in enumerate(zip(spec, greedy[0])) if a != b)
    print(f"FAIL: speculative output differs from greedy decoding at byte {first}")
  else:
    print("check: speculative output == greedy output (token for token)")
  for m in modes[1:]:
    out, a = results[m][:2]
    if out != spec or a != acc:
      ok = False
      print(f"FAIL: {m} mode differs from {mode} mode (tokens equal: {out == spec}, "
            f"acceptance counts equal: {a == acc})")
    else:
      print(f"check: {m} == {mode}: same tokens and same acceptance counts in every call")
  if FLAGS.abba_prompts:
    abba(decoders, modes)
  if not ok:
    sys.exit(1)


def abba(decoders, modes):
  """Tokens/s of speculative decoding per mode over several prompts, runs in ABBA order."""
  other = [m for m in ("snapshot", "compact") if m not in modes[:1]][0]
  if other not in decoders:
    return
  a, b = modes[0], other
  speeds = {a: [], b: []}
  for text in ABBA_PROMPTS[:FLAGS.abba_prompts]:
    prompt = text.encode()
    for d in decoders.values():
      d.compile(len(prompt))
    for m in (a, b, b, a):
      out, _, secs = decoders[m].run(prompt, FLAGS.max_new_tokens, True, FLAGS.ngram)[:3]
      speeds[m].append(len(out) / secs)
  print(f"ABBA over {FLAGS.abba_prompts} prompts, {FLAGS.max_new_tokens} tokens each "
        "(tokens/s, every run):")
  for m in (a, b):
    print(f"  {m}: mean {np.mean(speeds[m]):.1f}  median {np.median(speeds[m]):.1f}  "
          f"runs {[round(v, 1) for v in speeds[m]]}")


if __name__ == "__main__":
  app.run(main)

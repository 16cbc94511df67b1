"""Speculative decoding of the example Mamba-2 model through m2v_jax's verify op.

Prefills the prompt, then decodes greedily: each step verifies R rows (the last token plus up
to R-1 drafts found by prompt lookup, an n-gram match in the text so far) in one call per
layer, and the next step starts from `state_row` = the last accepted row. It prints the prompt
and the text as it is generated, between marker lines, then the acceptance rate and speeds,
and checks that

* the speculative output is the plain greedy output (one token per call): token for token,
  or up to a first differing token where the greedy logits are a near-tie (their top two
  within `TIE_BOUND` of the largest; one call of R rows reads y from its start state in the
  SSD dual form, so its logits equal R one-row calls' to float32 rounding, not bitwise), and
* (with --compare_modes) snapshot and compact replay produce the same tokens and the same
  acceptance counts.

With --tree_branches > 1 (the default, 3) it also decodes in each mode with draft trees of
the same rows per call: the continuations of several earlier occurrences of the matched
n-gram, merged into a trie (`lookup_tree`), verified in one call (`parents`); the accepted
path is walked from the root. Its output is checked against greedy the same way (and across
modes, as the chains'), and its tokens per call are printed beside the chain's.

Any mismatch ends the program with exit status 1. Speeds: after compiling both steps and a
warm-up, every variant (speculative decoding in each mode, greedy decoding) runs --repeats
times in rotating order; tokens/s are the median and range over those runs, and the speed-up
over greedy is the median of the per-repeat ratios (it cannot exceed the tokens per call by
much: a larger figure is timing noise).

    .venv/bin/python examples/decode.py --prompt="def main(" --max_new_tokens=300

The model is a Hugging Face `Mamba2ForCausalLM` checkpoint (examples/weights/mamba2_stdlib:
config.json and safetensors, trained by train.py), read with `m2v_jax.hf.load` and run
through `m2v_jax.hf.forward`, i.e. `m2v_jax.layer.mixer` in every layer.

Both decoders call the same jitted step with R rows; the greedy one marks a single row live
(`num_rows=1`), so the dense layers see the same shapes and round alike in both.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as model_lib  # noqa: E402

import m2v_jax as m2v  # noqa: E402
from m2v_jax import hf  # noqa: E402

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
flags.DEFINE_string("weights", os.path.join(HERE, "weights", "mamba2_stdlib"),
                    "Hugging Face Mamba2 checkpoint directory")
flags.DEFINE_string("prompt", DEFAULT_PROMPT, "prompt text")
flags.DEFINE_string("prompt_file", None, "read the prompt from this file instead")
flags.DEFINE_integer("max_new_tokens", 256, "bytes to generate (the first comes from the "
                     "prefill)", lower_bound=2)
flags.DEFINE_integer("rows", 8, "rows per verify call (last token + rows-1 drafts); the "
                     "state capacity S = W", lower_bound=1)
flags.DEFINE_integer("ngram", 3, "longest n-gram the prompt-lookup drafter matches",
                     lower_bound=1)
flags.DEFINE_enum("replay_mode", "snapshot", ["snapshot", "compact", "0", "1"],
                  "replay mode (ONNX Runtime's 0 | 1 = snapshot | compact)")
flags.DEFINE_bool("compare_modes", True, "also decode in the other mode and compare")
flags.DEFINE_integer("tree_branches", 3, "also decode with draft trees of up to this many "
                     "branches (each mode, the same rows per call); 1: chains only",
                     lower_bound=1)
flags.DEFINE_string("backend", None, "m2v_jax backend (default: pallas on GPU, else reference)")
flags.DEFINE_bool("quiet", False, "do not stream the generated text")
flags.DEFINE_integer("repeats", 3, "timed runs of each variant (speculative per mode, greedy), "
                     "interleaved; tokens/s are reported as median and range", lower_bound=1)


# A first token where speculative and greedy decoding differ is explained when the greedy
# logits there have their top two within this fraction of the largest |logit|.
TIE_BOUND = 1e-4


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


def lookup_tree(tokens: bytes, k: int, max_ngram: int, branches: int):
  """A draft tree of up to k bytes: the continuations of the latest `branches` earlier
  occurrences of the longest suffix n-gram that has any, with distinct continuations, merged
  into a trie and grown a level at a time across them. Returns (draft bytes, parents): node i
  (1-based; node 0 is the last token) holds drafts[i - 1] under node parents[i - 1]."""
  conts = []
  for n in range(max_ngram, 0, -1):
    if len(tokens) <= n:
      continue
    end = len(tokens) - 1
    while len(conts) < branches:
      at = tokens.rfind(tokens[-n:], 0, end)
      if at < 0:
        break
      follow = tokens[at + n:at + n + k]
      if follow and all(not c.startswith(follow) and not follow.startswith(c) for c in conts):
        conts.append(follow)
      end = at + n - 1
    if conts:
      break
  drafts, parents, child = bytearray(), [], {}
  at = [0] * len(conts)                          # each continuation's node so far
  for depth in range(k):
    for b, c in enumerate(conts):
      if depth >= len(c) or len(drafts) >= k:
        continue
      key = (at[b], c[depth])
      if key not in child:
        drafts.append(c[depth])
        parents.append(at[b])
        child[key] = len(drafts)
      at[b] = child[key]
  return bytes(drafts), parents


def whitespace_note(text: bytes) -> str:
  """A line saying what was generated when it is only whitespace (else ""), so that blank
  output does not look like a hang."""
  if text.strip():
    return ""
  return f"(the model generated only whitespace: {len(text)} bytes, {text[:24]!r})"


class Decoder:
  """Holds the compiled prefill and verify steps of one mode."""

  def __init__(self, cfg: hf.ModelConfig, params: hf.ModelParams, mode: str, rows: int,
               backend):
    ssm = cfg.mixer.ssm.replace(capacity=rows, replay_mode=mode)
    self.cfg = dataclasses.replace(cfg, mixer=dataclasses.replace(cfg.mixer, ssm=ssm))
    self.params, self.R, self.backend = params, rows, backend

    def mk(prefill):
      def step(params, states, tokens, state_row, num_rows=None, parents=None):
        return hf.forward(self.cfg, params, states, tokens, state_row, num_rows=num_rows,
                          parents=parents, prefill=prefill, backend=backend)
      return jax.jit(step, donate_argnums=(1,))

    self._prefill_jit, self._verify_jit = mk(True), mk(False)
    self._prefill, self._verify = self._prefill_jit, self._verify_jit
    self._verify_tree = self._verify_jit

  def fresh_states(self):
    return hf.init_states(self.cfg, 1, jnp.float32)

  def compile(self, prompt_len: int):
    """Compiles both steps ahead of time so that timings exclude compilation."""
    states = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.fresh_states())
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    self._prefill = self._prefill_jit.lower(self.params, states, i32(1, prompt_len),
                                            i32(1)).compile()
    self._verify = self._verify_jit.lower(self.params, states, i32(1, self.R), i32(1),
                                          i32(1)).compile()
    self._verify_tree = self._verify_jit.lower(self.params, states, i32(1, self.R), i32(1),
                                               i32(1), i32(1, self.R)).compile()

  def prefill(self, prompt: bytes):
    states = self.fresh_states()
    toks = jnp.asarray(np.frombuffer(prompt, np.uint8).astype(np.int32)[None])
    logits, states = self._prefill(self.params, states, toks, jnp.zeros((1,), jnp.int32))
    first = int(np.argmax(np.asarray(logits)[0, -1]))      # on the host: no op to compile
    return first, states, min(len(prompt), self.R) - 1

  def top_two_gap(self, text: bytes) -> float:
    """The gap between the two largest next-token logits after `text`, over the largest
    |logit| (a prefill of the whole text, compiled for its length)."""
    toks = jnp.asarray(np.frombuffer(text, np.uint8).astype(np.int32)[None])
    logits, _ = self._prefill_jit(self.params, self.fresh_states(), toks,
                                  jnp.zeros((1,), jnp.int32))
    last = np.sort(np.asarray(logits, np.float64)[0, -1])
    return float((last[-1] - last[-2]) / np.max(np.abs(last)))

  def run(self, prompt: bytes, max_new: int, speculative: bool, ngram: int, stream=None,
          branches: int = 1):
    """Decodes max_new bytes; `branches` > 1 drafts a tree (`lookup_tree`).
    Returns (generated bytes, accepted drafts per call, seconds, prefill seconds, drafts
    proposed per call)."""
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
      tree = speculative and branches > 1
      if tree:
        drafts, parents = lookup_tree(bytes(text), self.R - 1, ngram, branches)
      else:
        drafts = lookup_drafts(bytes(text), self.R - 1, ngram) if speculative else b""
        parents = list(range(len(drafts)))
      toks = np.zeros((1, self.R), np.int32)
      toks[0, 0] = nxt
      toks[0, 1:1 + len(drafts)] = np.frombuffer(drafts, np.uint8)
      n = 1 + len(drafts)
      call = (self.params, states, jnp.asarray(toks), jnp.asarray([row], jnp.int32),
              jnp.asarray([n], jnp.int32))
      if tree:           # rows past n: a chain (they do not run)
        par = np.array([[-1] + parents + list(range(n - 1, self.R - 1))], np.int32)
        logits, states = self._verify_tree(*call, jnp.asarray(par))
      else:
        logits, states = self._verify(*call)
      preds = np.argmax(np.asarray(logits)[0, :n], axis=-1)  # host: no compile for each n
      # Walk from the root: the child holding the predicted byte, while there is one.
      path, node = [], 0
      while True:
        nxt_node = next((i + 1 for i, (b, p_) in enumerate(zip(drafts, parents))
                         if p_ == node and b == preds[node]), None)
        if nxt_node is None:
          break
        path.append(nxt_node)
        node = nxt_node
      accepted.append(len(path))
      proposed.append(len(drafts))
      new = bytes(drafts[i - 1] for i in path)
      text.extend(new)
      out.extend(new)
      if stream and new:
        stream(new)
      nxt, row = int(preds[node]), node
    return bytes(out[:max_new]), accepted, time.perf_counter() - t0, t_prefill, proposed


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)     # JAX's INFO lines (backends it did not find)
  if not os.path.isfile(os.path.join(FLAGS.weights, "config.json")):
    sys.exit(f"decode.py: --weights={FLAGS.weights}: not a checkpoint directory (config.json)")
  cfg, params = hf.load(FLAGS.weights)
  meta = model_lib.load_meta(FLAGS.weights)
  if FLAGS.prompt_file:
    if not os.path.isfile(FLAGS.prompt_file):
      sys.exit(f"decode.py: --prompt_file={FLAGS.prompt_file}: no such file")
    with open(FLAGS.prompt_file, "rb") as fh:
      prompt = fh.read()
  else:
    prompt = FLAGS.prompt.encode()
  if not prompt:
    sys.exit("decode.py: the prompt is empty")
  mode = m2v.parse_replay_mode(FLAGS.replay_mode)
  try:
    backend = m2v.resolve_backend(FLAGS.backend)
  except ValueError as err:
    sys.exit(f"decode.py: {err}")
  dev = jax.devices()[0]
  print(f"model: {meta}\ndevice: {dev.device_kind} ({dev.platform}), m2v_jax backend: "
        f"{backend}, mode: {mode}, rows per call: {FLAGS.rows}, prompt: {len(prompt)} bytes")
  others = [m for m in ("snapshot", "compact") if m != mode]
  modes = [mode] + (others if FLAGS.compare_modes else [])
  tree = FLAGS.tree_branches > 1
  decoders = {m: Decoder(cfg, params, m, FLAGS.rows, backend) for m in modes}
  print("compiling ...", flush=True)
  for d in decoders.values():
    d.compile(len(prompt))
  for d in decoders.values():             # warm-up: first executions allocate and load
    d.run(prompt, 8, True, FLAGS.ngram)
    d.run(prompt, 8, False, FLAGS.ngram)

  if not FLAGS.quiet:            # shown once, in a run of its own: printing is not timed
    print(f"\n----- prompt ({len(prompt)} bytes) -----")
    sys.stdout.buffer.write(prompt)
    print(f"\n----- generated ({mode}, speculative) -----", flush=True)

    def stream(b):
      sys.stdout.buffer.write(b)
      sys.stdout.flush()

    shown = decoders[mode].run(prompt, FLAGS.max_new_tokens, True, FLAGS.ngram, stream=stream)[0]
    print("\n----- end -----")
    note = whitespace_note(shown)
    if note:
      print(note)

  # Timed runs: every variant decodes the same tokens; their order rotates between repeats so
  # that no variant always runs first or last. tokens/s per run; speed-ups paired per repeat.
  # (mode, True): chain drafts; (mode, False): greedy; (mode, "tree"): draft trees.
  variants = ([(m, True) for m in modes] + [(mode, False)]
              + ([(m, "tree") for m in modes] if tree else []))
  runs = {v: [] for v in variants}
  for r in range(FLAGS.repeats):
    k = r % len(variants)
    for v in variants[k:] + variants[:k]:
      runs[v].append(decoders[v[0]].run(
          prompt, FLAGS.max_new_tokens, v[1] is not False, FLAGS.ngram,
          branches=FLAGS.tree_branches if v[1] == "tree" else 1))
  rate = lambda res: len(res[0]) / res[2]
  spread = lambda xs: (f"{np.median(xs):.1f} (median of {len(xs)}; "
                       f"{min(xs):.1f}-{max(xs):.1f})")

  ok = True
  spec, acc, _, pre, drafts = runs[(mode, True)][0]
  greedy = runs[(mode, False)][0][0]
  print(f"\nprefill: {len(prompt)} tokens in {pre * 1e3:.1f} ms ({len(prompt) / pre:.0f} "
        f"tokens/s, first run)")
  # Tokens per call count the verify calls' tokens: the first token comes from the prefill.
  per_call = lambda res: (len(res[0]) - 1) / max(len(res[1]), 1)
  for m in modes:
    res = runs[(m, True)]
    print(f"speculative [{m}]: {len(res[0][0])} tokens, {len(res[0][1])} verify calls "
          f"({per_call(res[0]):.2f} tokens per call), tokens/s "
          f"{spread([rate(x) for x in res])}")
  for m in modes if tree else ():
    res = runs[(m, "tree")]
    print(f"speculative tree [{m}, up to {FLAGS.tree_branches} branches]: "
          f"{len(res[0][0])} tokens, {len(res[0][1])} verify calls ({per_call(res[0]):.2f} "
          f"tokens per call; {sum(res[0][1])} of {sum(res[0][4])} draft nodes accepted), "
          f"tokens/s {spread([rate(x) for x in res])}")
  res = runs[(mode, False)]
  print(f"greedy [{mode}]: {len(greedy)} tokens, {len(res[0][1])} calls, tokens/s "
        f"{spread([rate(x) for x in res])}")
  speedup = [rate(s_) / rate(g) for s_, g in zip(runs[(mode, True)], runs[(mode, False)])]
  ceiling = per_call(runs[(mode, True)][0])
  noise = ("; above that: timing noise, try more --repeats" if np.median(speedup) > ceiling * 1.1
           else "")
  print(f"acceptance: {sum(acc)} of {sum(drafts)} draft rows accepted "
        f"({sum(acc) / max(sum(drafts), 1):.1%}); speed-up over greedy "
        f"{np.median(speedup):.2f}x (median of {len(speedup)} paired runs; "
        f"{min(speedup):.2f}-{max(speedup):.2f}x; at most about "
        f"{ceiling:.2f}x, the tokens per call{noise})")
  ties = []
  for m, spec_run in (v for v in variants if v[1] is not False):
    for i, res in enumerate(runs[(m, spec_run)]):
      if res[0] != greedy:
        first = next((j for j, (a, b) in enumerate(zip(res[0], greedy)) if a != b),
                     min(len(res[0]), len(greedy)))
        gap = decoders[mode].top_two_gap(prompt + greedy[:first])
        if gap < TIE_BOUND:
          ties.append(f"[{m}{' tree' if spec_run == 'tree' else ''}] run {i} at byte "
                      f"{first} (top-two gap {gap:.1e})")
        else:
          ok = False
          print(f"FAIL: speculative [{m}{' tree' if spec_run == 'tree' else ''}] run {i} "
                f"differs from greedy decoding at byte {first}, "
                f"where the greedy logits' top two are {gap:.1e} apart (bound {TIE_BOUND:.0e})")
      want = acc if spec_run is True else runs[(mode, "tree")][0][1]
      if res[1] != want:
        ok = False
        kind = " tree" if spec_run == "tree" else ""
        print(f"FAIL: speculative [{m}{kind}] run {i}: acceptance counts differ from "
              f"[{mode}{kind}] run 0")
  if ok:
    print("check: speculative output == greedy output "
          + ("(token for token) in every run" if not ties else
             "up to near-ties of the greedy logits: " + "; ".join(ties))
          + (f"; {', '.join(modes)} give the same acceptance counts in every call"
             if len(modes) > 1 else ""))
  if not ok:
    sys.exit(1)


if __name__ == "__main__":
  if any(a in ("-h", "--help", "--helpshort") for a in sys.argv[1:]):
    print(__doc__)
    print(FLAGS.main_module_help())
    sys.exit(0)
  app.run(main)

import sys, time
sys.path.insert(0, '/work/main/examples'); sys.argv = ['x']
import decode, numpy as np
from m2v_jax import hf
from absl import flags
flags.FLAGS(['x'])
cfg, params = hf.load(decode.FLAGS.weights)
prompt = decode.DEFAULT_PROMPT.encode()
d = decode.Decoder(cfg, params, "snapshot", 8, "reference")
orig = decode.lookup_tree

def variant(alt):
  def lt(tokens, k, max_ngram, branches):
    drafts, parents = orig(tokens, k, max_ngram, branches)
    return drafts, parents
  if alt is None:
    return orig
  def lt2(tokens, k, max_ngram, branches):
    # continuations as in lookup_tree
    conts = []
    for n in range(max_ngram, 0, -1):
      if len(tokens) <= n: continue
      end = len(tokens) - 1
      while len(conts) < branches:
        at = tokens.rfind(tokens[-n:], 0, end)
        if at < 0: break
        follow = tokens[at + n:at + n + k]
        if follow and all(not c.startswith(follow) and not follow.startswith(c) for c in conts):
          conts.append(follow)
        end = at + n - 1
      if conts: break
    drafts, parents, child = bytearray(), [], {}
    def add(c, upto):
      node = 0
      for depth in range(min(upto, len(c))):
        key = (node, c[depth])
        if key not in child:
          if len(drafts) >= k: return
          drafts.append(c[depth]); parents.append(node); child[key] = len(drafts)
        node = child[key]
    if conts:
      add(conts[0], k - alt * (len(conts) - 1))
      for c in conts[1:]:
        add(c, alt)
      add(conts[0], k)
    return bytes(drafts), parents
  return lt2

for alt in ():
  for br in (2, 3):
    decode.lookup_tree = variant(alt)
    out, acc, *_ = d.run(prompt, 300, True, 3, branches=br)
    print(alt, br, "tokens/call", round((len(out) - 1) / len(acc), 3))
decode.lookup_tree = orig
out, acc, *_ = d.run(prompt, 300, True, 3)
print("chain tokens/call", round((len(out) - 1) / len(acc), 3))
print("----")
for p_ in (prompt, b"def main(", b"class Foo:\n    def __init__(self"):
  for n in (120, 400):
    res = {}
    for name, fn, br in (("chain", orig, 1), ("bal3", orig, 3), ("alt1x3", variant(1), 3), ("alt1x2", variant(1), 2), ("alt2x3", variant(2), 3)):
      decode.lookup_tree = fn
      out, acc, *_ = d.run(p_, n, True, 3, branches=br)
      res[name] = round((len(out) - 1) / len(acc), 3)
    print(p_[:12], n, res)

"""Writes copies of the package whose compact SSM kernel leaves out one part of its work, for
timing only (their results are wrong): python3 ablate_ssm.py OUT_DIR. Each copy is
OUT_DIR/<name>/m2v_jax:
  rows1   the fold loads its first row for every row (the same lines: L1 hits if any)
  nofold  no fold (n_fold rows are not folded)
  noy     no y (segment_y returns at once)
  copy    neither: the state loaded and stored
"""
import os
import shutil
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "m2v_jax")
FOLD = "        loaded = ring(r + FOLD_AHEAD)\n"
LOOP = "lax.fori_loop(0, n_fold, fold_row, carry)"
Y = '    """Stores y of rows t0..t0+L-1 from start state S (exact in `held`); 0 past num_rows, gated."""\n'
EDITS = {
    "rows1": [(FOLD, "        loaded = ring(jnp.minimum(r + FOLD_AHEAD, jnp.maximum(n_fold - 64, 0)))\n")],
    "nofold": [(LOOP, "lax.fori_loop(0, jnp.minimum(n_fold, 0), fold_row, carry)")],
    "noy": [(Y, Y + "    return\n")],
    "copy": [(LOOP, "lax.fori_loop(0, jnp.minimum(n_fold, 0), fold_row, carry)"),
             (Y, Y + "    return\n")],
}
out = sys.argv[1]
for name, edits in EDITS.items():
  dst = os.path.join(out, name, "m2v_jax")
  shutil.rmtree(dst, ignore_errors=True)
  shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__"))
  path = os.path.join(dst, "kernels", "verify_ssm.py")
  text = open(path).read()
  for old, new in edits:
    assert text.count(old) == 1, (name, old)
    text = text.replace(old, new)
  open(path, "w").write(text)
  print(name, "->", dst)

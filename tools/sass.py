"""Offline view of what the Triton compiler makes of the kernels, on a machine with no GPU.

Lowers one call (Bolt geometry by default) for an H200, writes each kernel's Triton IR, and,
where the upstream `triton` package is installed (`pip install triton`; it is not a
dependency), compiles the IR for sm_90 with FMA contraction off (as XLA's Triton compiles
Pallas kernels) and writes the TTGIR (layouts), PTX and SASS, with the registers, stack
(spills) and an instruction histogram per kernel. Upstream Triton is not the Triton inside
XLA, so read the result as a close proxy: it showed the layout conversions, the selects and
the register spills discussed in BENCHMARKS.md.

    python tools/sass.py --mode=compact --rows=8 --out=/tmp/sass
    python tools/sass.py --mode=compact --batch=32 --window=32 --out=/tmp/sass_w32
    python tools/sass.py --mode=snapshot --rows=4096 --chunked --out=/tmp/sass
    python tools/sass.py --mode=snapshot --rows=2048 --chunked --precision=highest
    python tools/sass.py --mode=snapshot --rows=2048 --chunked \
      --chunk_tiles=chunk=128:block_p=64:state_heads=16:state_stages=3:fused_pass=1:out_rows=128:out_warps=8
"""

from __future__ import annotations

import collections
import os
import re
import subprocess

import jax
import jax.numpy as jnp
from absl import app, flags

from m2v_jax import config as config_lib, dispatch
from m2v_jax.kernels import backend
from m2v_jax.kernels import tiles as tiles_lib

FLAGS = flags.FLAGS


def _define_flags():
  """The CLI's flags, defined only when run as a program (importing defines none)."""
  flags.DEFINE_enum("mode", "compact", ["snapshot", "compact"], "replay mode")
  flags.DEFINE_integer("rows", 8, "rows R of the call")
  flags.DEFINE_integer("batch", 1, "sequences B of the call")
  flags.DEFINE_integer("window", None, "compact mode: deferred-commit window W")
  flags.DEFINE_bool("chunked", False, "a chunked prefill call (R > capacity)")
  flags.DEFINE_string("out", "/tmp/m2v_sass", "output directory")
  flags.DEFINE_enum("precision", None, list(config_lib.PREFILL_PRECISIONS),
                    "the chunked prefill's products (default: by activation dtype)")
  flags.DEFINE_string("tiles", None, "verify tiles, as `TileConfig.replace_from_text` reads "
                      "them (default: the table's)")
  flags.DEFINE_string("chunk_tiles", None, "--chunked: the chunked prefill's tiles, as "
                      "`ChunkTiles.from_text` reads them (fields not given: ChunkTiles' "
                      "defaults; without the flag, the table's)")
  flags.DEFINE_bool("tree", False, "a draft tree's verify call (`parents`)")
  flags.DEFINE_integer("capacity", None, "capacity (default: Bolt's, 8)")
  flags.DEFINE_bool("z", False, "a gated call (z given)")


def kernels_of_call(cfg, B, R, chunked=False, dtype=jnp.bfloat16, tiles=None, tree=False,
                    z=False, chunk_tiles=None):
  """`backend.triton_kernels` of one verify / prefill call of `cfg` (verify `tiles`: a
  `TileConfig`, default the table's; `tree`: a draft tree's verify call; `z`: gated;
  `chunk_tiles`: a chunked prefill's `ChunkTiles`, default the table's)."""
  def f(p, s, a, *par):
    if (tiles is not None or tree) and not chunked:
      return dispatch.kernel_call(cfg, config_lib.PALLAS, p, s, a, tiles,
                                  parents=par[0] if par else None)
    return dispatch.call(p, s, a, cfg=cfg, backend=config_lib.PALLAS, chunked=chunked,
                         ragged=False, chunk_tiles=chunk_tiles)

  par = (jax.ShapeDtypeStruct((B, R), jnp.int32),) if tree else ()
  return backend.triton_kernels(f, *dispatch.abstract_call_args(cfg, B, R, z=z, dtype=dtype), *par,
                                donate_argnums=(1,))


def compile_sm90(ttir_path, num_warps, num_stages):
  """Compiles a .ttir file with upstream Triton for sm_90; returns (ttgir, ptx, sass,
  resource usage line with the dynamic shared memory a program asks for at launch)."""
  import triton
  from triton.backends.compiler import GPUTarget
  kernel = triton.compile(ttir_path, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       enable_fp_fusion=False))
  cubin = ttir_path[:-5] + ".cubin"
  with open(cubin, "wb") as fh:
    fh.write(kernel.asm["cubin"])
  tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
  sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
  usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1].strip()
  usage += f" DYNAMIC_SHARED:{kernel.metadata.shared}"
  return kernel.asm["ttgir"], kernel.asm["ptx"], sass, usage


def histogram(sass: str) -> collections.Counter:
  """Instruction counts (opcode without modifiers) of a SASS listing."""
  ops_ = re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass, re.M)
  return collections.Counter(ops_)


def main(argv):
  del argv
  cfg = config_lib.BOLT.replace(replay_mode=FLAGS.mode, prefill_precision=FLAGS.precision,
                                window=FLAGS.window,
                                capacity=FLAGS.capacity or config_lib.BOLT.capacity)
  os.makedirs(FLAGS.out, exist_ok=True)
  tiles = None
  if FLAGS.tiles:
    tiles = tiles_lib.tile_config(cfg, FLAGS.batch).replace_from_text(FLAGS.tiles)
  chunk_tiles = None
  if FLAGS.chunk_tiles:
    if not FLAGS.chunked:
      raise app.UsageError("--chunk_tiles: with --chunked only")
    try:
      chunk_tiles = tiles_lib.ChunkTiles.from_text(FLAGS.chunk_tiles)
    except ValueError as err:
      raise app.UsageError(f"--chunk_tiles: {err}") from None
  for name, (ir, warps, stages) in kernels_of_call(cfg, FLAGS.batch, FLAGS.rows,
                                                   FLAGS.chunked, tiles=tiles,
                                                   tree=FLAGS.tree, z=FLAGS.z,
                                                   chunk_tiles=chunk_tiles).items():
    path = os.path.join(FLAGS.out, name + ".ttir")
    with open(path, "w") as fh:
      fh.write(ir)
    try:
      ttgir, ptx, sass, usage = compile_sm90(path, warps, stages)
    except ImportError:
      print(f"{name}: wrote {path} (install triton to compile it)")
      continue
    for ext, text in (("ttgir", ttgir), ("ptx", ptx), ("sass", sass)):
      with open(path[:-5] + "." + ext, "w") as fh:
        fh.write(text)
    hist = histogram(sass)
    print(f"{name} (num_warps={warps}, num_stages={stages}): {usage}")
    print(f"  {sum(hist.values())} instructions: " +
          ", ".join(f"{op} {n}" for op, n in hist.most_common(12)))


if __name__ == "__main__":
  _define_flags()
  app.run(main)

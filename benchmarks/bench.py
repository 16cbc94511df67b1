"""Benchmarks of the verify and prefill ops (run on a GPU; BENCHMARKS.md gives the method).

Every timed step is one jitted dispatch that runs the op once on each of
`banks` separate state sets, donated, so every call updates its own set in place. The sets
together should exceed the L2 cache (60 MB on the H200) so that it cannot hold a set's state
between two calls on it: true for snapshot banks (33 MiB a sequence) and for batches >= 2,
not for compact at B=1 in 8 banks (8 x 4.5 MiB), whose times may be flattered by L2 hits.
Steps are issued back to back without synchronizing, so the host runs ahead and the wall
clock over a block measures the device stream, as long as a step's dispatch takes the host
less time than the step takes the device. At B=1 it may not, so the loop suite runs B=1 over
16 sets (compact: 72 MiB) as slices of one pool (8 state arrays, not 128) at 128 calls per
dispatch, and prints beside each time the device's busy time per call from a profiler trace
(every device event's duration, kernels and copies alike; idle time excluded). Blocks of A
and B alternate (ABBA), several warm-up steps come first, and a result is the median over
blocks with the ratio of means and its bootstrap 95% interval. Beside each time stands its floor: the compulsory bytes (each state read once
and written once, inputs and outputs once) over the copy bandwidth measured in the same run.

    python benchmarks/bench.py --suites=loop,batch,prefill --out=/tmp/bench.json
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from jax import lax

from m2v_jax import config as config_lib
from m2v_jax import dispatch
from m2v_jax import params as params_lib
from m2v_jax import reference
from m2v_jax import status
from m2v_jax import reference_ssd
from m2v_jax import state as state_lib
from m2v_jax import tree as tree_lib
from m2v_jax.kernels import chunk_scan
from m2v_jax.kernels import tiles as tiles_lib

MiB = 1 << 20


# ----------------------------------------------------------------------------------------------
# Copy bandwidth (the ceiling) and compulsory bytes (the floor)
# ----------------------------------------------------------------------------------------------


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 10, per_sync: int = 5) -> dict:
  """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written.

  Two copies are timed, `per_sync` back to back between synchronizations: XLA's `copy` and
  an elementwise kernel (x + 1). The faster one is the ceiling, so floors are never
  flattered.
  """
  x = jnp.ones((nbytes // 4,), jnp.float32)
  kernels = {"memcpy": jax.jit(lambda a: jnp.copy(a)), "elementwise": jax.jit(lambda a: a + 1.0)}
  out = {}
  for name, fn in kernels.items():
    fn(x).block_until_ready()
    times = []
    for _ in range(reps):
      t0 = time.perf_counter()
      ys = [fn(x) for _ in range(per_sync)]
      jax.block_until_ready(ys)
      times.append((time.perf_counter() - t0) / per_sync)
      del ys
    out[name] = 2 * nbytes / statistics.median(times)
  out["best"] = max(out.values())
  return out


def ssd_flops(cfg: config_lib.Mamba2Config, B: int, R: int, chunk: int = 64) -> float:
  """Matmul FLOPs of the chunked scan over R rows (C·Bᵀ, its product with x, C·stateᵀ, the
  state update), per the SSD algorithm; the padded last chunk counts whole."""
  L, P, N, H = chunk, cfg.headdim, cfg.dstate, cfg.nheads
  nc = -(-R // L)
  return float(B * H * nc * (2 * L * L * N + 2 * L * L * P + 4 * L * N * P))


def call_bytes(cfg: config_lib.Mamba2Config, B: int, R: int, state_row, dtype,
               conv_dtype=None, has_z: bool = False, num_rows=None,
               state_dtype=jnp.float32, replayed=None, base_writes=None) -> int:
  """Compulsory bytes of one call in `cfg.replay_mode` (see the module docstring).

  Snapshot: read the start state (ssm + conv), write min(n, S) snapshots. Compact: read the
  base (ssm + conv) and the `state_row + 1` folded ring rows (post-conv x and B, dt), write
  the base ssm, the conv state and the n new rows (raw xBC, ring row). Both: the n rows'
  inputs (xBC, dt, z) read once, their y written once,
  parameters read once. `state_row` and `num_rows` (n, default R) are one int for every
  sequence or one per sequence. An SSM state takes `state_dtype`'s bytes per element. With
  deferred commit, `replayed` (window rows folded, all sequences) and `base_writes`
  (sequences that flush) replace the defaults (state_row + 1 each; every sequence).
  """
  if replayed is None:
    replayed = int(np.sum(np.broadcast_to(np.asarray(state_row) + 1, (B,))))
  base_writes = B if base_writes is None else base_writes
  rows = np.broadcast_to(np.asarray(R if num_rows is None else num_rows), (B,))
  params = 4 * (cfg.conv_dim * (cfg.d_conv + 1) + 3 * cfg.nheads)
  ab = jnp.dtype(dtype).itemsize
  cb = jnp.dtype(conv_dtype or dtype).itemsize
  H, P, N, C, K1 = cfg.nheads, cfg.headdim, cfg.dstate, cfg.conv_dim, cfg.d_conv - 1
  ssm = jnp.dtype(state_dtype).itemsize * H * P * N
  conv = C * K1 * cb
  row_io = C * ab + H * ab + (cfg.d_inner * ab if has_z else 0) + cfg.d_inner * ab
  kept = int(np.sum(np.minimum(rows, cfg.capacity)))
  io = int(np.sum(rows)) * row_io
  if not cfg.compact:
    return B * (ssm + conv) + kept * (ssm + conv) + io + params
  ring_row = (cfg.d_inner + cfg.ngroups * N) * ab + H * 4
  return (B * (ssm + 2 * conv) + base_writes * ssm + 12 * B + kept * (C * ab + ring_row) + io
          + replayed * ring_row + params)


def window_traffic(cfg, rows, nrows, R, cycles=3, trees=None):
  """Compact: (window rows folded, sequences that flush) of each call (r, j) of an acceptance
  table `rows`, `nrows` [rounds, banks, B] (with `trees` [rounds, banks, B, R], each call a
  draft tree: the fold takes the accepted row's path, and a path with a gap flushes), in the
  steady state of a loop that runs the rounds over and over on state sets warmed with R
  pending rows (`status.flushes`)."""
  rounds, banks, B = rows.shape
  pending, first = np.full((banks, B), R), np.zeros((banks, B), int)
  chain = np.tile(np.arange(1, R + 1), (B, 1))  # each row's path length in a chain
  if trees is not None:                          # and in each call's tree
    bits = np.asarray(tree_lib.ancestor_bits(trees.reshape(-1, R))).astype(np.uint32)
    lengths = np.unpackbits(bits.view(np.uint8).reshape(bits.shape + (4,)), axis=-1).sum(-1)
    lengths = lengths.reshape(trees.shape)
  last = [chain] * banks                         # the last call's, per bank
  out = np.zeros((rounds, banks, 2), int)
  for _ in range(cycles):
    for r in range(rounds):
      for j in range(banks):
        span = np.where(pending[j] > 0, first[j] + rows[r, j] + 1, 0)
        path = last[j][np.arange(B), rows[r, j]]
        n_fold = np.where(pending[j] > 0, first[j] + path, 0)
        flush = ((span + nrows[r, j] > cfg.window_rows) | (n_fold != span) if cfg.deferred
                 else np.ones(B, bool))
        first[j] = np.where(flush, 0, span)
        pending[j] = first[j] + nrows[r, j]
        out[r, j] = n_fold.sum(), int(np.sum(flush & (span > 0)))
        last[j] = chain if trees is None else lengths[r, j]
  return out


# ----------------------------------------------------------------------------------------------
# Stream timing with rotating state sets
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
  """One timed configuration: `step(states, args) -> states` runs the op once per state set."""

  name: str
  step: Callable
  states: tuple
  calls_per_step: int
  nbytes: int | None = None
  flops: float | None = None
  args: tuple = ()


def make_case(name, fn, make_state, banks, nbytes=None, flops=None, warm_fn=None,
              min_calls=None, args=(), rounds=None):
  """Builds a Case: `fn(state, *args, call=(round, bank)) -> (state, y)` is the op.

  One step runs the op over all `banks` state sets, `rounds` times (default: enough that a
  dispatch holds at least `min_calls` calls, so the host's dispatch cost stays below the
  device time). The inputs `args` are arguments of the step, not constants folded into it.
  Every call's y is an output of the step (dropped by the host), so XLA computes all of it:
  a y that nothing used would let XLA drop the work that only feeds y.
  """
  states = tuple(make_state() for _ in range(banks))
  if warm_fn is not None:
    states = tuple(warm_fn(s) for s in states)
  rounds = rounds or -(-(min_calls or _min_calls) // banks)

  def many(ss, a):
    ys = []
    for r in range(rounds):
      out = [fn(s, *a, call=(r, j)) for j, s in enumerate(ss)]
      ss = tuple(o[0] for o in out)
      ys.extend(o[1] for o in out)
    return ss, ys

  jitted = jax.jit(many, donate_argnums=0)
  step = lambda ss, a: jitted(ss, a)[0]
  return Case(name, step, states, banks * rounds, nbytes, flops, tuple(args))


def _run_block(case: Case, steps: int) -> float:
  states = case.states
  jax.block_until_ready(states)
  t0 = time.perf_counter()
  for _ in range(steps):
    states = case.step(states, case.args)
  jax.block_until_ready(states)
  dt = time.perf_counter() - t0
  case.states = states
  return dt / (steps * case.calls_per_step)


def _calibrate(case: Case, target_s: float = 0.02) -> int:
  case.states = case.step(case.states, case.args)      # compile + warm up
  case.states = case.step(case.states, case.args)
  per_call = _run_block(case, 2)
  return max(3, min(200, int(target_s / (per_call * case.calls_per_step))))


def time_cases(cases: list[Case], blocks: int = 15, target_s: float = 0.02) -> dict:
  """Times cases in interleaved blocks (order reversed every other block). Returns per-case
  lists of per-call seconds."""
  steps = {c.name: _calibrate(c, target_s) for c in cases}
  for c in cases:
    _run_block(c, steps[c.name])
  times = {c.name: [] for c in cases}
  for blk in range(blocks):
    order = cases if blk % 2 == 0 else cases[::-1]
    for c in order:
      times[c.name].append(_run_block(c, steps[c.name]))
  return times


def ratio_ci(a: list[float], b: list[float], n_boot: int = 2000, seed: int = 0):
  """Ratio of means mean(a)/mean(b) with a paired bootstrap 95% interval."""
  a, b = np.asarray(a), np.asarray(b)
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(a), (n_boot, len(a)))
  boots = a[idx].mean(1) / b[idx].mean(1)
  return float(a.mean() / b.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def kernel_times(case: Case, steps: int = 10) -> dict[str, float]:
  """Per-kernel device time (µs per call) of a case, from a profiler trace.

  Returns {} when the trace holds no device events (no GPU, or CUPTI unavailable).
  """
  case.states = case.step(case.states, case.args)
  jax.block_until_ready(case.states)
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(steps):
        case.states = case.step(case.states, case.args)
      jax.block_until_ready(case.states)
    paths = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs
             if f.endswith("perfetto_trace.json.gz")]
    if not paths:
      return {}
    with gzip.open(paths[0]) as fh:
      data = json.load(fh)
  events = data["traceEvents"] if isinstance(data, dict) else data
  gpu_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
              and "GPU" in str(e.get("args", {}).get("name", ""))}
  total: dict[str, float] = {}
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in gpu_pids and "dur" in e:
      total[e["name"]] = total.get(e["name"], 0.0) + float(e["dur"])
  calls = steps * case.calls_per_step
  return {k: v / calls for k, v in sorted(total.items(), key=lambda kv: -kv[1])}


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------


def _inputs(cfg, B, R, dtype, seed=0):
  rng = np.random.default_rng(seed)
  xbc = jnp.asarray(rng.normal(size=(B, R, cfg.conv_dim)), dtype)
  dt = jnp.asarray(rng.normal(-1.0, 1.0, size=(B, R, cfg.nheads)), dtype)
  return xbc, dt


def index_args(B, R, state_row):
  """(state_row, cache_indices, num_rows), [B] int32 device arrays, for `verify_fn`: arguments
  of the timed step, as a serving loop passes them (not constants closed over)."""
  return (jnp.asarray(np.broadcast_to(np.asarray(state_row, np.int32), (B,))),
          jnp.arange(B, dtype=jnp.int32), jnp.full((B,), R, jnp.int32))


def verify_fn(cfg, backend, tiles=None, chunked=False, chunk_tiles=None):
  """`(state, params, xbc, dt, *index_args(...)) -> (state, y)` for one verify/prefill call
  (kernels or reference)."""

  def fn(state, params, xbc, dt, rows, ci, nr, call=None):
    del call
    args = status.call_args(xbc, dt, rows, None, ci, nr)
    if backend == config_lib.REFERENCE:
      call = (reference.snapshot_call if cfg.replay_mode == config_lib.SNAPSHOT
              else reference.compact_call)
      y, state = call(cfg, params, state, args)
    elif chunked:
      y, state = dispatch.call(params, state, args, cfg=cfg, backend=backend, chunked=True,
                               ragged=False, chunk_tiles=chunk_tiles)
    else:
      y, state = dispatch.kernel_call(cfg, backend, params, state, args, tiles)
    return state, y

  return fn


def dense_ssd_fn(cfg, chunk=64, precision=None):
  """`(state, ...) -> (state, y)`: the jax.numpy chunked SSD scan (`reference_ssd.ssd_chunked`, XLA einsums
  with 3-pass TF32 on a GPU, float32 elsewhere) from slot 0 / the base, writing its final
  state back there."""
  if precision is None:
    precision = (lax.DotAlgorithmPreset.TF32_TF32_F32_X3 if jax.default_backend() == "gpu"
                 else lax.Precision.HIGHEST)

  def fn(state, params, xbc, dt, call=None):
    del call
    snap = isinstance(state, state_lib.SnapshotState)
    ssm0 = state.ssm[:, 0] if snap else state.ssm
    conv0 = state.conv[:, 0] if snap else state.conv
    y, fin, conv = reference_ssd.ssd_chunked(cfg, params, ssm0, conv0, xbc, dt, chunk=chunk,
                                         precision=precision)
    y = y.astype(xbc.dtype)
    if snap:
      return state._replace(ssm=state.ssm.at[:, 0].set(fin),
                            conv=state.conv.at[:, 0].set(conv.astype(state.conv.dtype))), y
    return state._replace(ssm=fin, conv=conv.astype(state.conv.dtype)), y

  return fn


def verify_case(cfg, B, R, state_row, banks, dtype=jnp.bfloat16, backend=None,
                tiles=None, name=None, params=None, chunked=False, dense=False, min_calls=None,
                pending=True, chunk_tiles=None, window_state=None):
  """A Case for a steady-state call. Compact states are warmed so that `capacity` rows are
  pending and `state_row` replays state_row + 1 of them (`pending=False` clears the window
  before every call instead; `window_state=(pending, starts)` sets those before every call,
  e.g. to time deferred commit's flush and non-flush calls apart)."""
  params = params or params_lib.random_params(cfg)
  backend = backend or _backend_name
  xbc, dt = _inputs(cfg, B, R, dtype)
  if dense:
    fn = dense_ssd_fn(cfg)
    try:
      jax.jit(fn).lower(state_lib.state_shapes(cfg, B, dtype), params, xbc, dt).compile()
    except Exception as err:  # an XLA without the 3-pass TF32 algorithm: plain float32
      print(f"dense SSD baseline: {type(err).__name__}: {err}; using Precision.HIGHEST")
      fn = dense_ssd_fn(cfg, precision=lax.Precision.HIGHEST)
  else:
    fn = verify_fn(cfg, backend, tiles, chunked, chunk_tiles)
  warm = None
  if cfg.replay_mode == config_lib.COMPACT:
    wx, wd = _inputs(cfg, B, cfg.capacity, dtype, seed=1)
    warm_call = jax.jit(verify_fn(cfg, config_lib.REFERENCE), donate_argnums=0)
    warm_idx = index_args(B, cfg.capacity, 0)
    warm = lambda s: warm_call(s, params, wx, wd, *warm_idx)[0]
    if not pending:
      window_state = (0, 0)
    if window_state is not None:
      inner, (pend, starts) = fn, window_state
      fn = lambda s, *a, call=None: inner(s._replace(pending=jnp.full_like(s.pending, pend),
                                                     starts=jnp.full_like(s.starts, starts)), *a)
  rows = np.unique(np.asarray(state_row))
  row_txt = str(rows[0]) if len(rows) == 1 else "mixed"
  kind = ("dense-ssd" if dense else
          f"chunked {cfg.prefill_precision_for(dtype)}" if chunked else backend)
  name = name or f"{cfg.replay_mode} B={B} R={R} row={row_txt} {kind}"
  return make_case(name, fn, lambda: state_lib.init_state(cfg, B, dtype), banks,
                   nbytes=call_bytes(cfg, B, R, state_row, dtype), warm_fn=warm,
                   min_calls=min_calls,
                   args=(params, xbc, dt) + (() if dense else index_args(B, R, state_row)),
                   flops=ssd_flops(cfg, B, R) if (chunked or dense) else None), (params, xbc, dt)


# ----------------------------------------------------------------------------------------------
# Suites
# ----------------------------------------------------------------------------------------------


GEOMETRY = {"bolt": config_lib.BOLT,
            "small": config_lib.Mamba2Config(nheads=8, headdim=16, dstate=32, ngroups=2)}
_geom = config_lib.BOLT
_backend_name = config_lib.PALLAS
_min_calls = 16


def suite_main(bw, banks, blocks, dtype):
  """B=1: snapshot vs compact at R=8 (state_row 0/3/7) and R=1; the jnp reference at R=8."""
  rows_out = []
  snap = _geom
  comp = snap.replace(replay_mode=config_lib.COMPACT)
  params = params_lib.random_params(snap)
  for R, srow in [(8, 0), (8, 3), (8, 7), (1, 0)]:
    a, _ = verify_case(snap, 1, R, srow, banks, dtype, params=params)
    b, _ = verify_case(comp, 1, R, srow, banks, dtype, params=params)
    cases = [a, b]
    if (R, srow) == (8, 3):
      cases += [verify_case(c, 1, R, srow, banks, dtype, params=params,
                            backend=config_lib.REFERENCE)[0] for c in (snap, comp)]
    t = time_cases(cases, blocks)
    rows_out.append(_row(a, t[a.name], bw))
    rows_out.append(_row(b, t[b.name], bw, ratio_ci(t[a.name], t[b.name])))
    for ref, kern in zip(cases[2:], (a, b)):
      rows_out.append(_row(ref, t[ref.name], bw, ratio_ci(t[ref.name], t[kern.name])))
  return rows_out


def suite_batch(bw, banks, blocks, dtype, batches=(1, 8, 32, 128)):
  """Both modes at R=8 over batch sizes, mixed acceptance (state_row varies per sequence)."""
  rows_out = []
  snap = _geom
  comp = snap.replace(replay_mode=config_lib.COMPACT)
  params = params_lib.random_params(snap)
  for B in batches:
    if B == 1:
      continue          # in the main suite
    nb = max(2, min(banks, int(24 * (1 << 30) // (B * 40 * MiB))))
    srow = np.arange(B) % 8   # mixed acceptance: every state_row in turn
    cases = []
    for cfg in (snap, comp):
      c, _ = verify_case(cfg, B, 8, srow, nb, dtype, params=params)
      cases.append(c)
    t = time_cases(cases, blocks)
    ratio = ratio_ci(t[cases[0].name], t[cases[1].name])
    for c in cases:
      rows_out.append(_row(c, t[c.name], bw, ratio if c is cases[1] else None))
    del cases
  return rows_out


# Per-draft acceptance probability of the decode-loop suites: a draft is accepted with this
# probability while every earlier one was, so the accepted drafts of an R=8 call (at most 7)
# average about 2.9: the realistic mix of speculative decoding with a good drafter.
ACCEPT_PROB = 0.78


def acceptance_table(rng, rounds, banks, B, R, vary_rows=False, p=ACCEPT_PROB):
  """`state_row` and `num_rows` [rounds, banks, B] int32 of a decode loop: call (r, j) runs on
  state set j after its call (r - 1, j) (cyclically: round 0 follows the last round of the
  previous step). num_rows is R, or with `vary_rows` drawn uniformly from 1..R (drafts per
  call vary); state_row is the accepted drafts (a geometric draw with probability `p`),
  below the previous call's num_rows so that it is valid in both modes."""
  nrows = (rng.integers(1, R + 1, (rounds, banks, B)) if vary_rows
           else np.full((rounds, banks, B), R))
  accepted = np.minimum(rng.geometric(1 - p, (rounds, banks, B)) - 1, R - 1)
  prev = np.roll(nrows, 1, axis=0)
  return (np.minimum(accepted, prev - 1).astype(np.int32), nrows.astype(np.int32))


STATE_NAMES = {"float32": "", "bfloat16": " state=bf16", "float16": " state=f16"}


TREE_SHAPES = ("uniform", "bfs")


def tree_table(rng, rounds, banks, B, R, shape="uniform"):
  """Random draft trees [rounds, banks, B, R] int32, row 0 the root (-1). `uniform`: each
  later row's parent drawn uniformly among the rows before it. `bfs`: breadth-first levels of
  up to four rows after the root (the order in which EAGLE lists a top-k tree), each row's
  parent drawn among the level before it, its first rows likelier (weight 1 / (1 + rank)),
  a level's rows in their parents' order."""
  size = (rounds, banks, B, R)
  if shape == "uniform":
    r = np.arange(R)
    par = np.floor(rng.random(size) * np.maximum(r, 1)).astype(np.int32)
  elif shape == "bfs":
    par = np.zeros(size, np.int32)
    level, r = [0], 1
    while r < R:
      nxt = list(range(r, min(r + 4, R)))
      w = 1.0 / (1.0 + np.arange(len(level)))
      pick = np.sort(rng.choice(len(level), size=size[:-1] + (len(nxt),), p=w / w.sum()))
      par[..., nxt] = np.asarray(level, np.int32)[pick]       # siblings side by side
      level, r = nxt, nxt[-1] + 1
  else:
    raise ValueError(f"tree shape: expected one of {TREE_SHAPES}, got {shape!r}")
  par[..., 0] = -1
  return par


def loop_case(cfg, B, R, banks, dtype, params, vary_rows=False, seed=0, min_calls=None,
              state_dtype=jnp.float32, tiles=None, pooled=False, tree=False):
  """A Case whose calls draw `state_row` (and, with `vary_rows`, `num_rows`) from
  `acceptance_table`, a new draw for every call of a step, on a pool whose SSM state is
  stored in `state_dtype`, with the verify kernels' `tiles` (default: the table's); nbytes is
  the mean compulsory bytes of its calls. `pooled`: the `banks` sets are B-entry slices of
  one pool of banks * B entries (`cache_indices` pick them), as a serving engine's pool,
  which keeps the step's arguments few. `tree`: every call verifies a random draft tree
  (`tree_table`; True or "uniform", or another of TREE_SHAPES)."""
  rounds = -(-(min_calls or _min_calls) // banks)
  rng = np.random.default_rng(seed)
  rows, nrows = acceptance_table(rng, rounds, banks, B, R, vary_rows)
  shape = "uniform" if tree is True else tree
  label = "" if not tree else " tree" if shape == "uniform" else f" tree={shape}"
  tree_table_ = tree_table(rng, rounds, banks, B, R, shape) if tree else None
  trees = _per_call(tree_table_) if tree else None
  xbc, dt = _inputs(cfg, B, R, dtype)
  sets = 1 if pooled else banks
  entries = banks * B if pooled else B
  cis = tuple(jnp.arange(j * B, (j + 1) * B, dtype=jnp.int32) for j in range(banks if pooled
                                                                             else 1))

  # Every call's index arrays are arguments of the step, as a serving loop passes them (one
  # table with a slice per call would add a device copy per call), and checked as the public
  # ops check device values (shared entries rejected on the device).
  def fn(state, params, xbc, dt, rows, nrows, cis, trees, call):
    r, j = divmod(call[0], banks) if pooled else call
    nr = nrows[r][j] if vary_rows else nrows
    args = status.call_args(xbc, dt, rows[r][j], None, cis[j if pooled else 0], nr)
    parents = None if trees is None else trees[r][j]
    if tiles is not None:
      y, state = dispatch.kernel_call(cfg, _backend_name, params, state, args, tiles,
                                      entries_checked=False, parents=parents)
    else:
      y, state = dispatch.call(params, state, args, cfg=cfg, backend=_backend_name,
                               chunked=False, ragged=False, entries_checked=False,
                               parents=parents)
    return state, y

  warm = None
  if cfg.compact:
    warm_call = jax.jit(verify_fn(cfg, config_lib.REFERENCE), donate_argnums=0)
    wx, wd = _inputs(cfg, entries, R, dtype, seed=1)
    warm_idx = index_args(entries, R, 0)
    warm = lambda s: warm_call(s, params, wx, wd, *warm_idx)[0]
  traffic = (window_traffic(cfg, rows, nrows, R, trees=tree_table_ if tree else None)
             if cfg.compact else None)
  nbytes = float(np.mean([call_bytes(cfg, B, R, rows[r, j], dtype, num_rows=nrows[r, j],
                                     state_dtype=state_dtype,
                                     replayed=None if traffic is None else traffic[r, j, 0],
                                     base_writes=None if traffic is None else traffic[r, j, 1])
                          for r in range(rounds) for j in range(banks)]))
  name = (f"{cfg.replay_mode} B={B} R={R} row=accept" + (" num_rows=accept" if vary_rows else "")
          + (f" W={cfg.window}" if cfg.compact and cfg.deferred else "")
          + STATE_NAMES[jnp.dtype(state_dtype).name] + label
          + f" {_backend_name}"
          + (f" {_tiles_text(tiles)}" if tiles is not None else ""))
  return make_case(name, fn, lambda: state_lib.init_state(cfg, entries, dtype,
                                                         state_dtype=state_dtype),
                   sets, nbytes=nbytes, warm_fn=warm, rounds=rounds * banks // sets,
                   args=(params, xbc, dt, _per_call(rows),
                         _per_call(nrows) if vary_rows else jnp.full((B,), R, jnp.int32), cis,
                         trees))


def _per_call(table):
  """[rounds][banks] tuples of [B] device arrays from a [rounds, banks, B] table."""
  return tuple(tuple(jnp.asarray(v) for v in per_round) for per_round in table)


def suite_loop(bw, banks, blocks, dtype, batches=(1, 8, 32, 128), vary_batches=(32,),
               state_dtypes=("float32",), windows=(), tile_variants=()):
  """Both modes at R=8 as a decode loop runs them: every call draws its `state_row` from
  the acceptance mix (`ACCEPT_PROB`), amortized time per call; at `vary_batches`, also with
  `num_rows` varying from call to call; each of `state_dtypes` (the pool's SSM storage),
  compact mode with each deferred-commit window of `windows` and with each of
  `tile_variants` (`TileConfig.replace_from_text`), timed interleaved. Ratio: snapshot time
  over compact time of the same storage."""
  rows_out = []
  snap = _geom
  comp = snap.replace(replay_mode=config_lib.COMPACT)
  params = params_lib.random_params(snap)
  for B in batches:
    for vary in (False, True) if B in vary_batches else (False,):
      nb = max(2, min(banks, int(24 * (1 << 30) // (B * 40 * MiB))))
      # B=1: 16 sets (compact: 72 MiB, past the L2) as slices of one pool, 128 calls per
      # dispatch, so that the host's dispatch of a step stays below the device's time.
      pooled = B == 1 and _backend_name == config_lib.PALLAS
      nb, calls = (max(nb, 16), max(_min_calls, 128)) if pooled else (nb, None)
      pairs = [[loop_case(cfg, B, 8, nb, dtype, params, vary_rows=vary, seed=B,
                          state_dtype=jnp.dtype(sdt), min_calls=calls, pooled=pooled)
                for cfg in [snap, comp] + [comp.replace(window=w) for w in windows]]
               + [loop_case(comp, B, 8, nb, dtype, params, vary_rows=vary, seed=B,
                            state_dtype=jnp.dtype(sdt), min_calls=calls, pooled=pooled,
                            tiles=tiles_lib.tile_config(comp, B).replace_from_text(v))
                  for v in tile_variants]
               for sdt in state_dtypes]
      cases = [c for group in pairs for c in group]
      t = time_cases(cases, blocks)
      busy = {c.name: sum(kernel_times(c, steps=3).values()) or None for c in cases}
      for a, *others in pairs:
        rows_out.append(_row(a, t[a.name], bw, busy=busy[a.name]))
        for b in others:
          rows_out.append(_row(b, t[b.name], bw, ratio_ci(t[a.name], t[b.name]),
                               busy=busy[b.name]))
      print(format_rows(rows_out[-len(cases):]), flush=True)
      del cases
  return rows_out


def suite_tree(bw, banks, blocks, dtype, batches=(1, 8, 32, 128), sizes=(8, 16),
               modes=(config_lib.SNAPSHOT, config_lib.COMPACT), tile_variants=(),
               variant_chains=False, shapes=("uniform",)):
  """Each mode: draft trees of each of `shapes` (`tree_table`) against chains of the same
  rows (each of `sizes`, the capacity set to it), each call's tree and `state_row` drawn
  afresh; the 16-row trees also against the 8-row chain where `sizes` has both. Ratio: the
  chain's time over the tree's. Where `tile_variants` (`TileConfig.replace_from_text`) are
  given, first each mode's trees (and chains, with `variant_chains`) with each of them
  against the table's tiles, timed interleaved (ratio: the table's time over the
  variant's)."""
  rows_out = []
  params = params_lib.random_params(_geom)
  kinds = tuple(shapes) + ((False,) if variant_chains else ())
  groups = [(m, b, R, t) for m in modes for b in batches for R in sizes for t in kinds]
  for mode, B, R, tree in groups if tile_variants else ():
    # 1 + len(tile_variants) pools of R + 1 slots of 4 MiB a sequence live at once, within
    # 32 GiB (the groups' pools are not all freed between groups).
    pool_mib = (1 + len(tile_variants)) * (R + 1) * 4
    nb = max(1, min(banks, int(32 * (1 << 30) // (B * pool_mib * MiB))))
    cfg = _geom.replace(capacity=R, replay_mode=mode)
    base = loop_case(cfg, B, R, nb, dtype, params, seed=B, tree=tree)
    variants = [loop_case(cfg, B, R, nb, dtype, params, seed=B, tree=tree,
                          tiles=tiles_lib.tile_config(cfg, B).replace_from_text(v))
                for v in tile_variants]
    t = time_cases([base] + variants, blocks)
    rows_out.append(_row(base, t[base.name], bw))
    for v in variants:
      rows_out.append(_row(v, t[v.name], bw, ratio_ci(t[base.name], t[v.name])))
    print(format_rows(rows_out[-(1 + len(variants)):]), flush=True)
    del base, variants
  for mode in modes:
    for B in batches:
      # Snapshot: a chain's pool and each shape's live at once for each size, R + 1 slots of
      # 4 MiB a sequence (Bolt, float32); one set each where two would not fit in 48 GiB
      # (then far past the L2).
      pool_mib = (1 + len(shapes)) * sum(R + 1 for R in sizes) * 4
      nb = max(1, min(banks, int(48 * (1 << 30) // (B * pool_mib * MiB))))
      cases = {}
      for R in sizes:
        cfg = _geom.replace(capacity=R, replay_mode=mode)
        for tree in (False,) + tuple(shapes):
          cases[(R, tree)] = loop_case(cfg, B, R, nb, dtype, params, seed=B, tree=tree)
      t = time_cases(list(cases.values()), blocks)
      n0 = len(rows_out)
      for R in sizes:
        a = cases[(R, False)]
        rows_out.append(_row(a, t[a.name], bw))
        for shape in shapes:
          b = cases[(R, shape)]
          rows_out.append(_row(b, t[b.name], bw, ratio_ci(t[a.name], t[b.name])))
      if 8 in sizes and 16 in sizes:
        a = cases[(8, False)]
        for shape in shapes:
          b = cases[(16, shape)]
          rows_out.append(_row(b, t[b.name], bw, ratio_ci(t[a.name], t[b.name])))
      print(format_rows(rows_out[n0:]), flush=True)
      del cases
  return rows_out


def _tiles_text(tiles) -> str:
  """Every field of a tile dataclass as `name=value`: case names key the timings, so two
  variants must never share one."""
  return " ".join(f"{f.name}={getattr(tiles, f.name)}" for f in dataclasses.fields(tiles))


def suite_flush(bw, banks, blocks, dtype, batches=(8, 32, 128), window=16):
  """Compact mode at R=8, mixed state_row (b % 8), deferred commit apart: a call that does
  not flush (8 rows pending from one call: it folds state_row + 1 rows, reads the base and
  writes window rows only) and one that does (16 rows pending, the last call's from row 8:
  it folds 8 + state_row + 1 rows and writes the base), beside the default window (every
  call writes the base). Ratio: the default's time over the variant's."""
  rows_out = []
  comp = _geom.replace(replay_mode=config_lib.COMPACT)
  deferred = comp.replace(window=window)
  params = params_lib.random_params(comp)
  for B in batches:
    nb = max(2, min(banks, int(24 * (1 << 30) // (B * 40 * MiB))))
    srow = np.arange(B) % 8
    cases = [verify_case(comp, B, 8, srow, nb, dtype, params=params)[0]]
    for what, ws in (("no flush", (8, 1)), ("flush", (16, 1 | 1 << 8))):
      c, _ = verify_case(deferred, B, 8, srow, nb, dtype, params=params, window_state=ws,
                         name=f"compact B={B} R=8 row=mixed W={window} {what} {_backend_name}")
      first = 0 if what == "no flush" else 8
      c.nbytes = call_bytes(deferred, B, 8, srow, dtype, replayed=int(np.sum(first + srow + 1)),
                            base_writes=0 if what == "no flush" else B)
      cases.append(c)
    t = time_cases(cases, blocks)
    rows_out.append(_row(cases[0], t[cases[0].name], bw))
    for c in cases[1:]:
      rows_out.append(_row(c, t[c.name], bw, ratio_ci(t[cases[0].name], t[c.name])))
    print(format_rows(rows_out[-len(cases):]), flush=True)
    del cases
  return rows_out


# `kernels.tiles.TileConfig` variants, block_p:num_warps:n_cols[:num_stages] then any field
# as :name=value (`TileConfig.replace_from_text`); the table's entry comes first in any sweep.
DEFAULT_TILE_VARIANTS = ("64:4:64", "32:4:128", "64:8:64", "32:2:64", "16:4:128", "64:4:128")


def suite_sweep(bw, banks, blocks, dtype, batches=(1, 32), modes=("snapshot", "compact"),
                variants=DEFAULT_TILE_VARIANTS):
  """Tile sweep of the verify kernels at R=8, mixed acceptance (state_row b % 8): the table's
  entry, then `variants` (`TileConfig.replace_from_text`). Ratio: time of the variant over
  time of the table's entry."""
  unknown = set(modes) - {config_lib.SNAPSHOT, config_lib.COMPACT}
  if unknown:
    raise ValueError(f"sweep modes: expected snapshot and/or compact, got {sorted(unknown)}")
  rows_out = []
  snap = _geom
  comp = snap.replace(replay_mode=config_lib.COMPACT)
  params = params_lib.random_params(snap)
  for B in batches:
    nb = banks if B == 1 else max(2, min(banks, int(24 * (1 << 30) // (B * 40 * MiB))))
    for cfg in (c for c in (snap, comp) if c.replay_mode in modes):
      default = tiles_lib.tile_config(cfg, B)
      tiles = [default] + [t for t in (default.replace_from_text(v) for v in variants)
                           if t != default]
      cases = []
      for t in tiles:
        c, _ = verify_case(cfg, B, 8, np.arange(B) % 8, nb, dtype, tiles=t, params=params,
                           name=f"{cfg.replay_mode} B={B} {_tiles_text(t)}")
        cases.append(c)
      times = time_cases(cases, max(5, blocks // 3))
      for c in cases:
        rows_out.append(_row(c, times[c.name], bw, ratio_ci(times[c.name], times[cases[0].name])
                             if c is not cases[0] else None))
      print(format_rows(rows_out[-len(cases):]), flush=True)
      del cases
  return rows_out


# Fields in `tiles.ChunkTiles` order (chunk:block_p:num_warps:num_stages:local_block_p:
# state_warps:state_heads:state_stages:out_warps:out_heads:out_stages:conv_rows:conv_cols:
# conv_warps:...), then any field as name=value (`ChunkTiles.from_text`; others default).
DEFAULT_CHUNK_VARIANTS = (
    "64:16:4:1:64:4:16:2:8:1:1", "64:16:4:1:32:4:16:2:4:1:1", "64:16:4:1:64:4:8:2:4:1:1",
    "64:16:4:1:64:4:16:2:4:2:2", "128:16:4:1:64:4:16:2:4:1:1", "128:16:4:1:64:8:16:2:8:1:1",
    "128:16:4:1:32:4:16:2:4:1:1", "128:16:4:1:32:8:16:2:8:1:1", "128:16:4:1:64:4:8:2:8:1:1",
    "256:16:4:1:32:8:16:2:8:1:1", "256:16:4:1:64:8:16:2:8:1:1")


def suite_chunk_sweep(bw, banks, blocks, dtype, R=4096, variants=DEFAULT_CHUNK_VARIANTS,
                      B=1):
  """Chunked-prefill tiles at B sequences of R rows, snapshot mode: `variants` are
  `tiles.ChunkTiles` fields joined by ":" (chunk:block_p:num_warps:num_stages:local_block_p:
  state_warps:state_heads:state_stages:out_warps:out_heads:out_stages:conv_rows:conv_cols:
  conv_warps, then any field as name=value; fields not given default), after the table's
  entry. Each variant's final state and y are also checked against the serial kernel's from
  the same start (max abs difference over max abs value, `rel_err` of each; y is in the
  activation dtype, so a bfloat16 y differs by its rounding, ~1e-4). A variant that fails
  to compile is reported and skipped. Ratio: variant over the default (first row)."""
  del banks
  snap = _geom
  params = params_lib.random_params(snap)
  shapes = [tiles_lib.ChunkTiles.from_text(v) for v in variants]
  variants = []        # the table's first; P tiles as the kernels shrink them, no duplicates
  table = tiles_lib.chunk_tile_config(snap, snap.prefill_precision_for(dtype), dtype)
  for tiles in [table] + shapes:
    tiles = dataclasses.replace(
        tiles, block_p=tiles_lib.pow2_divisor(snap.headdim, tiles.block_p),
        local_block_p=tiles_lib.pow2_divisor(snap.headdim, tiles.local_block_p))
    if tiles not in variants:
      variants.append(tiles)
  xbc, dt = _inputs(snap, B, R, dtype)
  rng = np.random.default_rng(5)
  start = state_lib.init_state(snap, B, dtype)
  start = start._replace(ssm=jnp.asarray(rng.normal(size=start.ssm.shape), jnp.float32))
  copy = lambda s: jax.tree.map(jnp.copy, s)
  rows = jnp.zeros((B,), jnp.int32)
  rel = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                           / jnp.max(jnp.abs(b.astype(jnp.float32))))
  args = status.call_args(xbc, dt, rows)
  y_want, want = dispatch.call(params, copy(start), args, cfg=snap, backend=_backend_name,
                               chunked=False, ragged=False)
  cases, errs = [], {}
  for tiles in variants:
    name = f"chunked B={B} R={R} {_tiles_text(tiles)}"
    try:
      y, got = dispatch.call(params, copy(start), args, cfg=snap, backend=_backend_name,
                             chunked=True, ragged=False, chunk_tiles=tiles)
      errs[name] = rel(got.ssm[:, -1], want.ssm[:, -1]), rel(y, y_want)
      c, _ = verify_case(snap, B, R, 0, 2, dtype, params=params, min_calls=1, chunked=True,
                         chunk_tiles=tiles, name=name)
      c.states = c.step(c.states, c.args)
      cases.append(c)
    except Exception as err:  # a variant the Triton compiler rejects
      print(f"{name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
  t = time_cases(cases, max(3, blocks // 3), target_s=0.05)
  out = []
  for c in cases:
    row = _row(c, t[c.name], bw, ratio_ci(t[c.name], t[cases[0].name])
               if c is not cases[0] else None)
    row["name"] += " (rel_err state {:.1e}, y {:.1e})".format(*errs[c.name])
    out.append(row)
  return out


def suite_breakdown(dtype, prefill_rows=4096, chunk_tiles=None):
  """Per-kernel device times from a profiler trace: verify at B=1, R=8, state_row 7, in
  both modes, and a chunked prefill of `prefill_rows` rows (B=1, snapshot mode; with
  `chunk_tiles`, a `tiles.ChunkTiles`, instead of the table's)."""
  out = {}
  for mode in (config_lib.SNAPSHOT, config_lib.COMPACT):
    cfg = _geom.replace(replay_mode=mode)
    c, _ = verify_case(cfg, 1, 8, 7, 8, dtype)
    out[mode] = kernel_times(c)
    c.states = None
  c, _ = verify_case(_geom, 1, prefill_rows, 0, 2, dtype, min_calls=1, chunked=True,
                     chunk_tiles=chunk_tiles)
  out[f"chunked R={prefill_rows}"] = kernel_times(c, steps=3)
  c.states = None
  return out


def suite_prefill(bw, banks, blocks, dtype, lengths=(37, 512, 4096),
                  kinds=("serial", "chunked", "highest", "reference", "dense", "compact"),
                  serial_tiles=(), batch=1):
  """Prefill chunks (B=`batch`, 1 by default, snapshot mode): serial kernel, chunked kernel
  at the default product precision and at "highest" (the precision a word of the name), jnp
  reference scan, dense jnp SSD; the serial and chunked kernels in compact mode with nothing
  pending (one state written, not `capacity`); then compact chunked prefill at the longest
  length with and without a pending window.
  Chunked rows report the body's scratch (`chunk_scan.scratch_bytes`) in MB. `kinds` picks
  the cases (serial, chunked, highest, reference, dense, compact_serial, compact_chunked,
  compact); `serial_tiles` adds the serial kernel at those verify tiles
  (`TileConfig.replace_from_text`), timed after the other cases of each length (it needs the
  serial case). Ratio: over the first case."""
  if serial_tiles and "serial" not in kinds:
    raise ValueError("--serial_tiles: the prefill suite's cases must include serial")
  rows_out = []
  snap = _geom
  comp = snap.replace(replay_mode=config_lib.COMPACT)
  params = params_lib.random_params(snap)
  highest = snap.replace(prefill_precision=config_lib.HIGHEST)
  for R in lengths:
    calls = 8 if R < 256 else 1
    mk = lambda cfg=snap, **kw: verify_case(cfg, batch, R, 0, 2, dtype, params=params,
                                            min_calls=calls, **kw)[0]
    cases = {"serial": lambda: mk(), "chunked": lambda: mk(chunked=True),
             "highest": lambda: mk(highest, chunked=True),
             "reference": lambda: mk(backend=config_lib.REFERENCE),
             "dense": lambda: mk(dense=True),
             "compact_serial": lambda: mk(comp, pending=False),
             "compact_chunked": lambda: mk(comp, chunked=True, pending=False)}
    for v in serial_tiles:
      tiles = tiles_lib.tile_config(snap, batch).replace_from_text(v)
      cases[f"serial {v}"] = lambda tiles=tiles, v=v: mk(
          tiles=tiles, name=f"snapshot B={batch} R={R} row=0 serial {v}")
    if snap.prefill_precision_for(dtype) == config_lib.HIGHEST:
      del cases["highest"]                                   # the default is "highest"
    cases = [make() for name, make in cases.items() if name.split()[0] in kinds]
    t = time_cases(cases, max(3, blocks // 3), target_s=0.05)
    for c in cases:
      rows_out.append(_row(c, t[c.name], bw, ratio_ci(t[cases[0].name], t[c.name])
                           if c is not cases[0] else None))
      if " chunked " in c.name:
        cfg = highest if c.name.endswith(" highest") else comp if c.name.startswith(
            "compact") else snap
        rows_out[-1]["scratch_mb"] = chunk_scratch_mb(cfg, R, dtype, batch)
  if "compact" not in kinds:
    return rows_out
  R = max(lengths)
  mk = lambda row, **kw: verify_case(comp, 1, R, row, 2, dtype, params=params, min_calls=1,
                                     chunked=True, **kw)[0]
  W = comp.capacity
  cases = [mk(W - 1, name=f"compact B=1 R={R} chunked, {W} rows pending (pre-pass folds {W})"),
           mk(0, pending=False, name=f"compact B=1 R={R} chunked, nothing pending")]
  t = time_cases(cases, max(3, blocks // 3), target_s=0.05)
  rows_out.append(_row(cases[0], t[cases[0].name], bw))
  rows_out.append(_row(cases[1], t[cases[1].name], bw, ratio_ci(t[cases[0].name], t[cases[1].name])))
  return rows_out


RAGGED_LENGTHS = (300, 4000, 1500, 800, 3100, 600, 2200, 1200)


def suite_ragged(bw, banks, blocks, dtype, lengths=RAGGED_LENGTHS):
  """A batch of prompts of different lengths (snapshot mode, default precision), into a pool
  of len(lengths) entries: one packed prefill (`cu_seqlens`), one prompt of the same total
  length (B=1), one padded ragged prefill (`num_rows`, R = the longest), and the prompts one
  by one (one B=1 prefill of its own length each, all in one step). Ratio: each case over
  the packed one (above 1: the packed call is faster)."""
  del bw
  cfg = _geom
  B, R, T = len(lengths), max(lengths), sum(lengths)
  params = params_lib.random_params(cfg)
  xbc, dt = _inputs(cfg, B, R, dtype)
  n = jnp.asarray(lengths, jnp.int32)
  zeros = jnp.zeros((B,), jnp.int32)
  take = np.concatenate([b * R + np.arange(k) for b, k in enumerate(lengths)])
  flat_x, flat_dt = (a.reshape(B * R, -1)[take] for a in (xbc, dt))
  cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
  one_x, one_dt = _inputs(cfg, 1, T, dtype)

  def packed(state, params, x, d, cu, call=None):
    del call
    y, state = dispatch.packed(params, state, status.CallArgs(x, d, zeros, None, None, None),
                               cu, cfg=cfg, backend=_backend_name)
    return state, y

  def one_prompt(state, params, x, d, call=None):
    del call
    y, state = dispatch.call(params, state, status.call_args(x, d, zeros[:1]), cfg=cfg,
                             backend=_backend_name, chunked=True, ragged=False)
    return state, y

  def ragged(state, params, xbc, dt, call=None):
    del call
    y, state = dispatch.call(params, state, status.call_args(xbc, dt, zeros, None, None, n),
                             cfg=cfg, backend=_backend_name, chunked=True, ragged=True)
    return state, y

  def one_by_one(state, params, xbc, dt, call=None):
    del call
    ys = []
    for b, k in enumerate(lengths):
      args = status.call_args(xbc[b:b + 1, :k], dt[b:b + 1, :k], zeros[:1], None,
                              jnp.full((1,), b, jnp.int32))
      y, state = dispatch.call(params, state, args, cfg=cfg, backend=_backend_name,
                               chunked=True, ragged=False)
      ys.append(y)
    return state, ys

  flops = sum(ssd_flops(cfg, 1, k) for k in lengths)
  make = lambda name, fn, args, E=B: make_case(
      name, fn, lambda: state_lib.init_state(cfg, E, dtype), banks, min_calls=1, args=args,
      flops=flops)
  lens = ",".join(map(str, lengths))
  prec = cfg.prefill_precision_for(dtype)
  cases = [make(f"packed prefill S={B} n={lens} chunked {prec}", packed,
                (params, flat_x, flat_dt, cu)),
           make(f"one prompt B=1 R={T} chunked {prec}", one_prompt, (params, one_x, one_dt), 1),
           make(f"ragged prefill B={B} n={lens} chunked {prec}", ragged, (params, xbc, dt)),
           make(f"one by one B=1 x {B} n={lens} chunked {prec}", one_by_one,
                (params, xbc, dt))]
  t = time_cases(cases, max(3, blocks // 3), target_s=0.05)
  first = t[cases[0].name]
  return [_row(c, t[c.name], None, None if c is cases[0] else ratio_ci(t[c.name], first))
          for c in cases]


def chunk_scratch_mb(cfg, R, dtype, B=1) -> float:
  """MB of the chunked body's scratch for a prefill of R rows (`chunk_scan.scratch_bytes`)."""
  plan = dispatch.chunk_plan(cfg, _backend_name, state_lib.state_shapes(cfg, B, dtype),
                             B * R, B, dtype, False, R - cfg.capacity)
  return chunk_scan.scratch_bytes(plan) / 1e6


def _row(case: Case, times, bw, ratio=None, busy=None):
  """A result row; `busy`: the device's busy time per call from a trace (µs), where taken."""
  med = statistics.median(times)
  floor = case.nbytes / bw if case.nbytes else None
  return dict(name=case.name, median_us=med * 1e6, min_us=min(times) * 1e6,
              floor_us=floor * 1e6 if floor else None,
              x_floor=med / floor if floor else None,
              gbps=case.nbytes / med / 1e9 if case.nbytes else None,
              tflops=case.flops / med / 1e12 if case.flops else None,
              ratio=ratio, busy_us=busy)


def format_rows(rows) -> str:
  busy = any(r.get("busy_us") for r in rows)
  lines = ["| case | median µs | min µs | floor µs | x floor | GB/s | TFLOP/s | ratio (95% CI) |"
           + (" device µs |" if busy else ""), "|---|---|---|---|---|---|---|---|"
           + ("---|" if busy else "")]
  for r in rows:
    ratio = (f"{r['ratio'][0]:.2f} ({r['ratio'][1]:.2f}-{r['ratio'][2]:.2f})"
             if r.get("ratio") else "")
    floor = f"{r['floor_us']:.2f}" if r["floor_us"] else ""
    xf = f"{r['x_floor']:.2f}" if r["x_floor"] else ""
    gb = f"{r['gbps']:.0f}" if r["gbps"] else ""
    tf = f"{r['tflops']:.1f}" if r.get("tflops") else ""
    lines.append(f"| {r['name']} | {r['median_us']:.2f} | {r['min_us']:.2f} | {floor} | {xf} "
                 f"| {gb} | {tf} | {ratio} |"
                 + (f" {r['busy_us']:.2f} |" if r.get("busy_us") else " |" if busy else ""))
  return "\n".join(lines)


FLAGS = flags.FLAGS
flags.DEFINE_list("suites", ["main", "batch", "loop", "prefill", "breakdown"],
                  "suites to run: main, batch, loop, flush, sweep, chunk_sweep, prefill, ragged, "
                  "breakdown, tree")
flags.DEFINE_string("out", None, "write the results as JSON here")
flags.DEFINE_integer("banks", 8, "rotating state sets per case")
flags.DEFINE_integer("min_calls", 16, "calls per timed dispatch (at least; fewer compile faster)")
flags.DEFINE_integer("blocks", 15, "timed blocks per case")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "activation dtype")
flags.DEFINE_enum("geometry", "bolt", list(GEOMETRY), "layer geometry (small: a CPU smoke run)")
flags.DEFINE_enum("prefill_precision", None, list(config_lib.PREFILL_PRECISIONS),
                  "the geometry's prefill_precision (default: by activation dtype)")
flags.DEFINE_enum("backend", config_lib.PALLAS, list(config_lib.BACKENDS), "kernel backend")
flags.DEFINE_list("batches", ["1", "8", "32", "128"], "batch sizes of the batch and loop suites "
                  "(the batch suite leaves B=1 to the main suite)")
flags.DEFINE_list("state_dtypes", ["float32"], "SSM state storage dtypes of the loop suite "
                  "(float32, bfloat16, float16)")
flags.DEFINE_list("vary_batches", ["32"], "batch sizes at which the loop suite also varies "
                  "num_rows (empty: none)")
flags.DEFINE_list("windows", [], "deferred-commit windows of compact mode in the loop suite "
                  "(e.g. 16,32)")
flags.DEFINE_list("loop_tiles", [], "verify tiles of extra compact cases in the loop suite "
                  "(as --sweep_tiles), timed beside the table's")
flags.DEFINE_list("tree_tiles", [], "verify tiles of tree cases timed against the table's "
                  "first in the tree suite (`TileConfig.replace_from_text`, e.g. "
                  "32:4:64:tree_recompute=0)")
flags.DEFINE_list("tree_modes", ["snapshot", "compact"], "modes of the tree suite")
flags.DEFINE_list("tree_sizes", ["8", "16"], "rows of the tree suite's trees and chains (the "
                  "16-row trees are timed against the 8-row chain where both are given)")
flags.DEFINE_list("tree_shapes", ["uniform"], "draft-tree shapes of the tree suite: uniform "
                  "(each parent drawn among the rows before), bfs (breadth-first levels of up "
                  "to four rows, as EAGLE lists a top-k tree)")
flags.DEFINE_bool("tree_variant_chains", False, "the tree suite's --tree_tiles variants time "
                  "chains of the same rows too")
flags.DEFINE_list("lengths", ["37", "512", "4096"], "chunk lengths of the prefill suite")
flags.DEFINE_integer("prefill_batch", 1, "sequences B of the prefill suite's cases "
                     "but the `compact` case's (B=1)")
flags.DEFINE_list("prefill_cases", ["serial", "chunked", "highest", "reference", "dense",
                                     "compact"],
                  "cases of the prefill suite (also compact_serial, compact_chunked)")
flags.DEFINE_list("serial_tiles", [], "verify tiles of extra serial cases of the prefill "
                  "suite (`TileConfig.replace_from_text`, e.g. 64:4:64:body_rows=8)")
flags.DEFINE_list("ragged_lengths", [str(n) for n in RAGGED_LENGTHS],
                  "prompt lengths of the ragged suite")
flags.DEFINE_list("sweep_batches", ["1", "32"], "batch sizes of the sweep suite")
flags.DEFINE_list("sweep_modes", ["snapshot", "compact"], "modes of the sweep suite")
flags.DEFINE_list("sweep_tiles", list(DEFAULT_TILE_VARIANTS),
                  "verify tiles of the sweep suite, block_p:num_warps:n_cols[:num_stages] "
                  "then any TileConfig field as :name=value")
flags.DEFINE_string("breakdown_tiles", "",
                    "chunked-prefill tiles of the breakdown suite, tiles.ChunkTiles fields "
                    "joined by ':' as in --chunk_variants (default: the table's)")
flags.DEFINE_list("chunk_variants", list(DEFAULT_CHUNK_VARIANTS),
                  "ChunkTiles of the chunk_sweep suite, fields joined by ':', in order and "
                  "then as name=value (e.g. chunk=128:fused_pass=1)")
flags.DEFINE_integer("chunk_batch", 1, "sequences of the chunk_sweep suite")
flags.DEFINE_integer("chunk_rows", 4096, "rows R of each sequence of the chunk_sweep suite")
flags.DEFINE_integer("copy_mib", 2048, "size of the copy-bandwidth buffer")


def main(argv):
  del argv
  global _geom, _backend_name, _min_calls
  _min_calls = FLAGS.min_calls
  logging.set_verbosity(logging.WARNING)     # JAX's INFO lines (backends it did not find)
  try:
    _backend_name = config_lib.resolve_backend(FLAGS.backend)
  except ValueError as err:
    sys.exit(f"bench.py: {err}")
  _geom = GEOMETRY[FLAGS.geometry].replace(prefill_precision=FLAGS.prefill_precision)
  dtype = jnp.dtype(FLAGS.dtype)
  bw = copy_bandwidth(FLAGS.copy_mib * MiB)
  dev = jax.devices()[0]
  meta = dict(date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), device=dev.device_kind,
              platform=dev.platform, jax=jax.__version__, python=platform.python_version(),
              copy_bandwidth_gbps={k: v / 1e9 for k, v in bw.items()}, dtype=str(dtype),
              banks=FLAGS.banks, blocks=FLAGS.blocks, geometry=FLAGS.geometry,
              prefill_precision=FLAGS.prefill_precision, backend=FLAGS.backend)
  print(json.dumps(meta, indent=1), flush=True)
  results = dict(meta=meta)
  for suite in FLAGS.suites:
    t0 = time.perf_counter()
    if suite == "breakdown":
      tiles = FLAGS.breakdown_tiles and tiles_lib.ChunkTiles.from_text(FLAGS.breakdown_tiles)
      results[suite] = suite_breakdown(dtype, chunk_tiles=tiles or None)
      print(f"\n## {suite}\n" + json.dumps(results[suite], indent=1), flush=True)
    else:
      sweep = functools.partial(suite_sweep, batches=[int(b) for b in FLAGS.sweep_batches],
                                modes=FLAGS.sweep_modes, variants=FLAGS.sweep_tiles)
      chunk_sweep = functools.partial(suite_chunk_sweep, variants=FLAGS.chunk_variants,
                                      B=FLAGS.chunk_batch, R=FLAGS.chunk_rows)
      fn = dict(main=suite_main, sweep=sweep, chunk_sweep=chunk_sweep,
                batch=functools.partial(suite_batch, batches=[int(b) for b in FLAGS.batches]),
                flush=functools.partial(suite_flush, batches=[
                    int(b) for b in FLAGS.batches if int(b) > 1]),
                loop=functools.partial(suite_loop, batches=[int(b) for b in FLAGS.batches],
                                       vary_batches=[int(b) for b in FLAGS.vary_batches],
                                       state_dtypes=FLAGS.state_dtypes,
                                       windows=[int(w) for w in FLAGS.windows],
                                       tile_variants=FLAGS.loop_tiles),
                prefill=functools.partial(suite_prefill, lengths=[int(n) for n in FLAGS.lengths],
                                          kinds=FLAGS.prefill_cases,
                                          serial_tiles=FLAGS.serial_tiles,
                                          batch=FLAGS.prefill_batch),
                ragged=functools.partial(suite_ragged,
                                         lengths=[int(n) for n in FLAGS.ragged_lengths]),
                tree=functools.partial(suite_tree, batches=[int(b) for b in FLAGS.batches],
                                       modes=FLAGS.tree_modes, tile_variants=FLAGS.tree_tiles,
                                       variant_chains=FLAGS.tree_variant_chains,
                                       shapes=FLAGS.tree_shapes,
                                       sizes=[int(r) for r in FLAGS.tree_sizes]),
                )[suite]
      results[suite] = fn(bw["best"], FLAGS.banks, FLAGS.blocks, dtype)
      print(f"\n## {suite} ({time.perf_counter() - t0:.0f} s)\n" + format_rows(results[suite]),
            flush=True)
    if FLAGS.out:
      with open(FLAGS.out, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
  app.run(main)

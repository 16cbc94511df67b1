"""Prototype: the compact verify SSM step as a Mosaic GPU kernel, one (sequence, head) per CTA.

fold S1 = a*S0 + Xw^T B (two TF32 passes on a head/tail split of Xw), y^T = S1 C^T (two
passes on a head/tail split of S1), S1 stored in place. Measures time against the bytes.
"""
import functools, sys, time, json
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

f32 = jnp.float32
import os
INTERPRET = bool(os.environ.get("MG_INTERPRET"))


def tf32_tail(v):
  hi = lax.bitcast_convert_type(lax.bitcast_convert_type(v, jnp.uint32) & np.uint32(0xFFFFE000), f32)
  return v - hi


def swz(cols_bytes):
  sw = min(128, cols_bytes)
  return (plgpu.TilingTransform((8, sw // 4)), plgpu.SwizzleTransform(sw))


def make_step1(B, E, H=128, P=64, N=128, G=8, R=8, KT=8):
  HG = H // G

  V = os.environ.get("MG_VARIANT", "full")

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref,
           s_smem, lo_smem, xh_smem, xl_smem, bt_smem, c_smem, y_smem, bar):
    h, b = lax.axis_index("h"), lax.axis_index("b")
    g = h // HG
    e = idx_ref[b]
    a = a_ref[b, h]
    plgpu.copy_gmem_to_smem(pool_ref.at[e, h], s_smem, bar.at[0])
    plgpu.copy_gmem_to_smem(xh_ref.at[b, h], xh_smem, bar.at[1])
    plgpu.copy_gmem_to_smem(xl_ref.at[b, h], xl_smem, bar.at[2])
    plgpu.copy_gmem_to_smem(bt_ref.at[b, g], bt_smem, bar.at[3])
    plgpu.copy_gmem_to_smem(c_ref.at[b, g], c_smem, bar.at[4])
    for i in range(5):
      plgpu.barrier_wait(bar.at[i])
    if V in ("full", "noy", "scoped"):
      s0 = plgpu.load(s_smem, layout=plgpu.Layout.WGMMA)
      acc0 = s0 * a

      def fold(acc):
        plgpu.wgmma(acc, xh_smem, bt_smem.T)
        plgpu.wgmma(acc, xl_smem, bt_smem.T)

      def fold_scoped(acc):
        fold(acc)
        return acc[...]
      if V == "scoped":          # the form Mosaic GPU's interpreter runs: product, then the add
        s1 = acc0 + pl.run_scoped(fold_scoped, plgpu.ACC((P, N), f32))
      else:
        s1 = pl.run_state(fold)(plgpu.ACC.init(acc0))
      s_smem[...] = s1
      lo_smem[...] = tf32_tail(s1)
      plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(s_smem, pool_ref.at[e, h])
    if V in ("full", "nofold", "scoped"):
      def yprod(acc):
        plgpu.wgmma(acc, s_smem, c_smem.T)
        plgpu.wgmma(acc, lo_smem, c_smem.T)
        return acc[...]
      y = pl.run_scoped(yprod, plgpu.ACC((P, R), f32))
      y_smem[...] = y
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(y_smem, y_ref.at[b, h])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[plgpu.SMEM((P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((P, KT), f32, transforms=swz(KT * 4)),
                     plgpu.SMEM((P, KT), f32, transforms=swz(KT * 4)),
                     plgpu.SMEM((N, KT), f32, transforms=swz(KT * 4)),
                     plgpu.SMEM((R, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((P, R), f32), plgpu.Barrier(num_barriers=5)],
      grid=(H, B), grid_names=("h", "b"), kernel_name="mgpu_proto_step",
      **({"interpret": plgpu.InterpretGPUParams()} if INTERPRET else {}))

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


def make_pipe(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=264, stages=2):
  """Persistent: CTA c takes items c, c + ctas, ...; the next item's loads are in flight
  while the current one is folded and stored."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)
  NB = 5                                # barriers per stage: state, xh, xl, bt, c
  half = N // 2

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref,
           s_smem, xh_smem, xl_smem, bt_smem, c_smem, lo_smem, y_smem, bar):
    cid = lax.axis_index("c")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    def issue(k, slot):
      b, h, g, e = where(k)
      srcs = (pool_ref.at[e, h], xh_ref.at[b, h], xl_ref.at[b, h], bt_ref.at[b, g], c_ref.at[b, g])
      dsts = (s_smem, xh_smem, xl_smem, bt_smem, c_smem)
      for j, (src, dst) in enumerate(zip(srcs, dsts)):
        plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot * NB + j])

    issue(0, 0)

    @pl.loop(0, count)
    def _step(k):
      slot = lax.rem(k, stages)
      nxt = lax.rem(k + 1, stages)

      @pl.when(k + 1 < count)
      def _():
        plgpu.wait_smem_to_gmem(stages - 2, wait_read_only=True)
        issue(k + 1, nxt)
      for j in range(NB):
        plgpu.barrier_wait(bar.at[slot * NB + j])
      b, h, g, e = where(k)
      s_ref, xh, xl, bt, cc = (r.at[slot] for r in (s_smem, xh_smem, xl_smem, bt_smem, c_smem))
      s0 = plgpu.load(s_ref, layout=plgpu.Layout.WGMMA)
      acc0 = s0 * a_ref[b, h]

      def fold(acc):
        plgpu.wgmma(acc, xh, bt.T)
        plgpu.wgmma(acc, xl, bt.T)
      s1 = pl.run_state(fold)(plgpu.ACC.init(acc0))
      s_ref[...] = s1
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(s_ref, pool_ref.at[e, h], commit_group=False)

      def yprod(acc):
        plgpu.wgmma(acc, s_ref, cc.T)
        for q in range(2):
          cols = pl.ds(q * half, half)
          lo_smem[...] = tf32_tail(s_ref[:, cols])
          plgpu.commit_smem()
          plgpu.wgmma(acc, lo_smem, cc.at[:, cols].T)
          plgpu.wgmma_wait(0)
        return acc[...]
      y = pl.run_scoped(yprod, plgpu.ACC((P, R), f32))
      y_smem.at[slot][...] = y
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(y_smem.at[slot], y_ref.at[b, h], commit_group=False)
      plgpu.commit_smem_to_gmem_group()

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  st = lambda shape, t=None: plgpu.SMEM((stages,) + shape, f32, transforms=t) if t else plgpu.SMEM((stages,) + shape, f32)
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[st((P, N), swz(N * 4)), st((P, KT), swz(KT * 4)), st((P, KT), swz(KT * 4)),
                     st((N, KT), swz(KT * 4)), st((R, N), swz(N * 4)),
                     plgpu.SMEM((P, half), f32, transforms=swz(half * 4)), st((P, R)),
                     plgpu.Barrier(num_barriers=stages * NB)],
      grid=(ctas,), grid_names=("c",), kernel_name="mgpu_proto_pipe")

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


def bf16_parts(v, n=3):
  """v (float32) as n bfloat16 parts whose float32 sum is v to ~8n bits."""
  parts = []
  for _ in range(n):
    p_ = v.astype(jnp.bfloat16)
    parts.append(p_)
    v = v - p_.astype(f32)
  return parts


def make_regs(B, E, H=128, P=64, N=128, G=8, R=8, KT=16, ctas=264, ns=2):
  """Persistent; the state goes TMA -> shared -> registers, and its slot is refilled at
  once; the fold and y take bf16 parts in registers (exact bf16 products, float32
  accumulation); S1 and y go from registers to global memory."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)

  def body(idx_ref, a_ref, pool_ref, xw_ref, bw_ref, c_ref, y_ref,
           s_smem, xw_smem, bw_smem, c_smem, sbar, obar):
    cid = lax.axis_index("c")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    def issue_state(k):
      b, h, g, e = where(k)
      slot = lax.rem(k, ns)
      plgpu.copy_gmem_to_smem(pool_ref.at[e, h], s_smem.at[slot], sbar.at[slot])

    def issue_ops(k):
      b, h, g, e = where(k)
      slot = lax.rem(k, 2)
      plgpu.copy_gmem_to_smem(xw_ref.at[b, h], xw_smem.at[slot], obar.at[3 * slot])
      plgpu.copy_gmem_to_smem(bw_ref.at[b, g], bw_smem.at[slot], obar.at[3 * slot + 1])
      plgpu.copy_gmem_to_smem(c_ref.at[b, g], c_smem.at[slot], obar.at[3 * slot + 2])

    for k in range(ns):
      pl.when(k < count)(functools.partial(issue_state, k))
    for k in range(2):
      pl.when(k < count)(functools.partial(issue_ops, k))

    @pl.loop(0, count)
    def _step(k):
      b, h, g, e = where(k)
      slot, oslot = lax.rem(k, ns), lax.rem(k, 2)
      plgpu.barrier_wait(sbar.at[slot])
      s0 = plgpu.load(s_smem.at[slot], layout=plgpu.Layout.WGMMA)
      plgpu.commit_smem()       # every thread's read is done before the slot is refilled
      pl.when(k + ns < count)(lambda: issue_state(k + ns))
      for j in range(3):
        plgpu.barrier_wait(obar.at[3 * oslot + j])
      xw = plgpu.load(xw_smem.at[oslot], layout=plgpu.Layout.WGMMA)
      bw, cc = bw_smem.at[oslot], c_smem.at[oslot]

      def fold(acc):
        for part in bf16_parts(xw):
          plgpu.wgmma(acc, part, bw)
      s1 = pl.run_state(fold)(plgpu.ACC.init(s0 * a_ref[b, h]))

      def yprod(acc):
        for part in bf16_parts(s1):
          plgpu.wgmma(acc, plgpu.layout_cast(part, plgpu.Layout.WGMMA), cc.T)
        return acc[...]
      y = pl.run_scoped(yprod, plgpu.ACC((P, R), f32))
      plgpu.commit_smem()
      pl.when(k + 2 < count)(lambda: issue_ops(k + 2))
      pool_ref.at[e, h][...] = s1
      y_ref.at[b, h][...] = y

  bf = jnp.bfloat16
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[plgpu.SMEM((ns, P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((2, P, KT), f32, transforms=swz(KT * 4)),
                     plgpu.SMEM((2, KT, N), bf, transforms=(plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(32))),
                     plgpu.SMEM((2, R, N), bf, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))),
                     plgpu.Barrier(num_barriers=ns), plgpu.Barrier(num_barriers=6)],
      grid=(ctas,), grid_names=("c",), kernel_name="mgpu_proto_regs")

  def call(idx, a, pool, xw, bw, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xw, bw, c)
    return jax.ref.freeze(ref), y
  return call


def make_pipecopy(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=264, stages=2):
  """Persistent TMA copy of the states in place (no compute): `stages` loads ahead."""
  items = B * H
  ctas = min(ctas, items)

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref, s_smem, bar):
    cid = lax.axis_index("c")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      return i // H, i % H

    def issue(k):
      b, h = where(k)
      slot = lax.rem(k, stages)
      plgpu.copy_gmem_to_smem(pool_ref.at[idx_ref[b], h], s_smem.at[slot], bar.at[slot])

    for k in range(stages - 1):
      pl.when(k < count)(functools.partial(issue, k))

    @pl.loop(0, count)
    def _step(k):
      @pl.when(k + stages - 1 < count)
      def _():
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the slot's last store has left
        issue(k + stages - 1)
      slot = lax.rem(k, stages)
      plgpu.barrier_wait(bar.at[slot])
      b, h = where(k)
      plgpu.copy_smem_to_gmem(s_smem.at[slot], pool_ref.at[idx_ref[b], h])

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[plgpu.SMEM((stages, P, N), f32, transforms=swz(N * 4)),
                     plgpu.Barrier(num_barriers=stages)],
      grid=(ctas,), grid_names=("c",), kernel_name="mgpu_proto_pipecopy")

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


def make_ws(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=132, ns=4, prefetch=False, ybf16=False):
  """Warp-specialized: one CTA per SM, a producer warpgroup filling a ring of `ns` slots by
  TMA and two consumer warpgroups taking alternate items (each slot always serves the same
  consumer: ns is even); a consumer writes S1 into its slot, stores it by TMA and frees the
  slot once the store has read it."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)
  NB = 5
  half = N // 2
  assert ns % 2 == 0

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref,
           s_smem, xh_smem, xl_smem, bt_smem, c_smem, lo_smem, y_smem, full, free):
    cid, wg = lax.axis_index("c"), lax.axis_index("wg")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    @pl.when(wg == 2)
    def _producer():
      plgpu.set_max_registers(40, action="decrease")

      @pl.loop(0, count)
      def _(k):
        slot = lax.rem(k, ns)
        b, h, g, e = where(k)
        pl.when(k >= ns)(lambda: plgpu.barrier_wait(free.at[slot]))
        srcs = (pool_ref.at[e, h], xh_ref.at[b, h], xl_ref.at[b, h], bt_ref.at[b, g],
                c_ref.at[b, g])
        dsts = (s_smem, xh_smem, xl_smem, bt_smem, c_smem)
        for j, (src, dst) in enumerate(zip(srcs, dsts)):
          plgpu.copy_gmem_to_smem(src, dst.at[slot], full.at[slot * NB + j])

    @pl.when(wg < 2)
    def _consumer():
      plgpu.set_max_registers(232, action="increase")
      lo, ys = lo_smem.at[wg], y_smem.at[wg]

      def scalars(k):                  # the item's entry and decay (clamped past the end)
        b, h, g, e = where(jnp.minimum(k, count - 1))
        return e, a_ref[b, h]

      def item(j, carry):
        k = wg + 2 * j
        slot = lax.rem(k, ns)
        if prefetch:                   # this item's scalars came with the previous one
          e, a_k = carry
          carry = scalars(k + 2)
        for q in range(NB):
          plgpu.barrier_wait(full.at[slot * NB + q])
        b, h, g, e0 = where(k) if not prefetch else (*where(k)[:3], None)
        if not prefetch:
          e, a_k = e0, a_ref[b, h]
        s_ref, xh, xl, bt, cc = (r.at[slot] for r in (s_smem, xh_smem, xl_smem, bt_smem, c_smem))
        s0 = plgpu.load(s_ref, layout=plgpu.Layout.WGMMA)

        def fold(acc):                   # a scoped accumulator: the interpreter runs it
          plgpu.wgmma(acc, xh, bt.T)
          plgpu.wgmma(acc, xl, bt.T)
          return acc[...]
        s1 = s0 * a_k + pl.run_scoped(fold, plgpu.ACC((P, N), f32))
        s_ref[...] = s1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_ref, pool_ref.at[e, h], commit_group=False)

        def yprod(acc):                  # explicit TF32 head and tail, 64 columns at a time
          for q in range(2):
            cols = pl.ds(q * half, half)
            for part in range(2):
              v = s_ref[:, cols]
              tail = tf32_tail(v)
              lo[...] = tail if part else v - tail
              plgpu.commit_smem()
              plgpu.wgmma(acc, lo, cc.at[:, cols].T)
              plgpu.wgmma_wait(0)
          return acc[...]
        def yparts(acc):                 # S1 as three bf16 parts in registers, C bf16
          for part in bf16_parts(s1):
            plgpu.wgmma(acc, plgpu.layout_cast(part, plgpu.Layout.WGMMA), cc.T)
          return acc[...]
        y = pl.run_scoped(yparts if ybf16 else yprod, plgpu.ACC((P, R), f32))
        ys[...] = y
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(ys, y_ref.at[b, h], commit_group=False)
        plgpu.commit_smem_to_gmem_group()
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        pl.when(k + ns < count)(lambda: plgpu.barrier_arrive(free.at[slot]))  # if refilled
        return carry

      lax.fori_loop(0, (count - wg + 1) // 2, item, scalars(wg) if prefetch else 0)

  st = lambda shape, t: plgpu.SMEM((ns,) + shape, f32, transforms=t)
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[st((P, N), swz(N * 4)), st((P, KT), swz(KT * 4)), st((P, KT), swz(KT * 4)),
                     st((N, KT), swz(KT * 4)),
                     (plgpu.SMEM((ns, R, N), jnp.bfloat16, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))
                      if ybf16 else st((R, N), swz(N * 4))),
                     plgpu.SMEM((2, P, half) if not ybf16 else (2, 8, 32), f32, transforms=swz(half * 4)),
                     plgpu.SMEM((2, P, R), f32),
                     plgpu.Barrier(num_barriers=ns * NB),
                     plgpu.Barrier(num_arrivals=1, num_barriers=ns)],
      grid=(ctas,), grid_names=("c",), num_threads=3, thread_name="wg",
      kernel_name="mgpu_proto_ws",
      **({"interpret": plgpu.InterpretGPUParams()} if INTERPRET else {}))

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


def make_wsr(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=132, ns=4, nc=2):
  """Warp-specialized like make_ws, with nc consumers; a consumer keeps S1 in registers and
  stores it and y to global memory from there; y's product takes S1's TF32 head, then its
  tail, each written into the item's own slot (no other shared buffer)."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)
  NB = 5
  regs = {2: 232, 3: 152}[nc]
  D = -(-ns // nc)             # full barriers per consumer: each is waited by one consumer only

  def fb(k, q):                # item k's q-th full barrier
    return ((k % nc) * D + (k // nc) % D) * NB + q

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref,
           s_smem, xh_smem, xl_smem, bt_smem, c_smem, full, free):
    cid, wg = lax.axis_index("c"), lax.axis_index("wg")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    @pl.when(wg == nc)
    def _producer():
      plgpu.set_max_registers(40, action="decrease")

      @pl.loop(0, count)
      def _(k):
        slot = lax.rem(k, ns)
        b, h, g, e = where(k)
        pl.when(k >= ns)(lambda: plgpu.barrier_wait(free.at[slot]))
        srcs = (pool_ref.at[e, h], xh_ref.at[b, h], xl_ref.at[b, h], bt_ref.at[b, g],
                c_ref.at[b, g])
        dsts = (s_smem, xh_smem, xl_smem, bt_smem, c_smem)
        for j, (src, dst) in enumerate(zip(srcs, dsts)):
          plgpu.copy_gmem_to_smem(src, dst.at[slot], full.at[fb(k, j)])

    @pl.when(wg < nc)
    def _consumer():
      plgpu.set_max_registers(regs, action="increase")

      @pl.loop(0, (count - wg + nc - 1) // nc)
      def _(j):
        k = wg + nc * j
        slot = lax.rem(k, ns)
        for q in range(NB):
          plgpu.barrier_wait(full.at[fb(k, q)])
        b, h, g, e = where(k)
        s_ref, xh, xl, bt, cc = (r.at[slot] for r in (s_smem, xh_smem, xl_smem, bt_smem, c_smem))
        s0 = plgpu.load(s_ref, layout=plgpu.Layout.WGMMA)

        def fold(acc):
          plgpu.wgmma(acc, xh, bt.T)
          plgpu.wgmma(acc, xl, bt.T)
          return acc[...]
        s1 = s0 * a_ref[b, h] + pl.run_scoped(fold, plgpu.ACC((P, N), f32))
        pool_ref.at[e, h][...] = s1
        tail = tf32_tail(s1)

        def yprod(acc):                  # S1's explicit TF32 head, then its tail, in the slot
          for part in (s1 - tail, tail):
            s_ref[...] = part
            plgpu.commit_smem()
            plgpu.wgmma(acc, s_ref, cc.T)
            plgpu.wgmma_wait(0)
          return acc[...]
        y_ref.at[b, h][...] = pl.run_scoped(yprod, plgpu.ACC((P, R), f32))
        pl.when(k + ns < count)(lambda: plgpu.barrier_arrive(free.at[slot]))  # if refilled

  st = lambda shape, t: plgpu.SMEM((ns,) + shape, f32, transforms=t)
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[st((P, N), swz(N * 4)), st((P, KT), swz(KT * 4)), st((P, KT), swz(KT * 4)),
                     st((N, KT), swz(KT * 4)), st((R, N), swz(N * 4)),
                     plgpu.Barrier(num_barriers=nc * D * NB),
                     plgpu.Barrier(num_arrivals=1, num_barriers=ns)],
      grid=(ctas,), grid_names=("c",), num_threads=nc + 1, thread_name="wg",
      kernel_name="mgpu_proto_wsr",
      **({"interpret": plgpu.InterpretGPUParams()} if INTERPRET else {}))

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


def make_wso(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=132, ns=3):
  """Warp-specialized, two consumers: S1 goes to the consumer's own output buffer and is
  stored from there by TMA, so an item's slot is freed once its products have read it (no
  wait for the store); y from S1's three bf16 parts in registers (C bf16); the next item's
  entry and decay are loaded one item ahead."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)
  NB, nc = 5, 2
  D = -(-ns // nc)

  def fb(k, q):                # item k's q-th full barrier: waited by one consumer only
    return ((k % nc) * D + (k // nc) % D) * NB + q

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref,
           s_smem, xh_smem, xl_smem, bt_smem, c_smem, out_smem, y_smem, full, free):
    cid, wg = lax.axis_index("c"), lax.axis_index("wg")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    @pl.when(wg == nc)
    def _producer():
      plgpu.set_max_registers(40, action="decrease")

      @pl.loop(0, count)
      def _(k):
        slot = lax.rem(k, ns)
        b, h, g, e = where(k)
        pl.when(k >= ns)(lambda: plgpu.barrier_wait(free.at[slot]))
        srcs = (pool_ref.at[e, h], xh_ref.at[b, h], xl_ref.at[b, h], bt_ref.at[b, g],
                c_ref.at[b, g])
        dsts = (s_smem, xh_smem, xl_smem, bt_smem, c_smem)
        for j, (src, dst) in enumerate(zip(srcs, dsts)):
          plgpu.copy_gmem_to_smem(src, dst.at[slot], full.at[fb(k, j)])

    @pl.when(wg < nc)
    def _consumer():
      plgpu.set_max_registers(232, action="increase")
      out, ys = out_smem.at[wg], y_smem.at[wg]

      def scalars(k):
        b, h, g, e = where(jnp.minimum(k, count - 1))
        return e, a_ref[b, h]

      def item(j, carry):
        k = wg + nc * j
        slot = lax.rem(k, ns)
        e, a_k = carry
        carry = scalars(k + nc)
        for q in range(NB):
          plgpu.barrier_wait(full.at[fb(k, q)])
        b, h, g, _ = where(k)
        s_ref, xh, xl, bt, cc = (r.at[slot] for r in (s_smem, xh_smem, xl_smem, bt_smem, c_smem))
        s0 = plgpu.load(s_ref, layout=plgpu.Layout.WGMMA)

        def fold(acc):
          plgpu.wgmma(acc, xh, bt.T)
          plgpu.wgmma(acc, xl, bt.T)
          return acc[...]
        s1 = s0 * a_k + pl.run_scoped(fold, plgpu.ACC((P, N), f32))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the previous item's stores
        out[...] = s1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out, pool_ref.at[e, h], commit_group=False)

        def yparts(acc):
          for part in bf16_parts(s1):
            plgpu.wgmma(acc, plgpu.layout_cast(part, plgpu.Layout.WGMMA), cc.T)
          return acc[...]
        y = pl.run_scoped(yparts, plgpu.ACC((P, R), f32))
        pl.when(k + ns < count)(lambda: plgpu.barrier_arrive(free.at[slot]))  # if refilled
        ys[...] = y
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(ys, y_ref.at[b, h], commit_group=False)
        plgpu.commit_smem_to_gmem_group()
        return carry

      lax.fori_loop(0, (count - wg + nc - 1) // nc, item, scalars(wg))
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  st = lambda shape, t: plgpu.SMEM((ns,) + shape, f32, transforms=t)
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[st((P, N), swz(N * 4)), st((P, KT), swz(KT * 4)), st((P, KT), swz(KT * 4)),
                     st((N, KT), swz(KT * 4)),
                     plgpu.SMEM((ns, R, N), jnp.bfloat16, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))),
                     plgpu.SMEM((nc, P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((nc, P, R), f32),
                     plgpu.Barrier(num_barriers=nc * D * NB),
                     plgpu.Barrier(num_arrivals=1, num_barriers=ns)],
      grid=(ctas,), grid_names=("c",), num_threads=nc + 1, thread_name="wg",
      kernel_name="mgpu_proto_wso",
      **({"interpret": plgpu.InterpretGPUParams()} if INTERPRET else {}))

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


def make_wse(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=132, ns=4, no=3):
  """wso with the state's ring apart from the operands' ring: a state slot is freed as soon
  as the consumer has the state in registers, so nearly all `ns` state slots are loading;
  the producer keeps the states one item ahead of the operands (`no` slots)."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)
  NO, nc = 4, 2
  Ds, Do = -(-ns // nc), -(-no // nc)
  fs = lambda k: (k % nc) * Ds + (k // nc) % Ds          # waited by one consumer only
  fo = lambda k, q: ((k % nc) * Do + (k // nc) % Do) * NO + q

  def body(idx_ref, a_ref, pool_ref, xh_ref, xl_ref, bt_ref, c_ref, y_ref,
           s_smem, xh_smem, xl_smem, bt_smem, c_smem, out_smem, y_smem,
           sfull, ofull, sfree, ofree):
    cid, wg = lax.axis_index("c"), lax.axis_index("wg")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    @pl.when(wg == nc)
    def _producer():
      plgpu.set_max_registers(40, action="decrease")

      def state(k):
        slot = lax.rem(k, ns)
        b, h, g, e = where(k)
        pl.when(k >= ns)(lambda: plgpu.barrier_wait(sfree.at[slot]))
        plgpu.copy_gmem_to_smem(pool_ref.at[e, h], s_smem.at[slot], sfull.at[fs(k)])

      state(0)

      @pl.loop(0, count)
      def _(k):
        pl.when(k + 1 < count)(lambda: state(k + 1))
        slot = lax.rem(k, no)
        b, h, g, e = where(k)
        pl.when(k >= no)(lambda: plgpu.barrier_wait(ofree.at[slot]))
        srcs = (xh_ref.at[b, h], xl_ref.at[b, h], bt_ref.at[b, g], c_ref.at[b, g])
        dsts = (xh_smem, xl_smem, bt_smem, c_smem)
        for j, (src, dst) in enumerate(zip(srcs, dsts)):
          plgpu.copy_gmem_to_smem(src, dst.at[slot], ofull.at[fo(k, j)])

    @pl.when(wg < nc)
    def _consumer():
      plgpu.set_max_registers(232, action="increase")
      out, ys = out_smem.at[wg], y_smem.at[wg]

      def scalars(k):
        b, h, g, e = where(jnp.minimum(k, count - 1))
        return e, a_ref[b, h]

      def item(j, carry):
        k = wg + nc * j
        slot, oslot = lax.rem(k, ns), lax.rem(k, no)
        e, a_k = carry
        carry = scalars(k + nc)
        b, h, g, _ = where(k)
        plgpu.barrier_wait(sfull.at[fs(k)])
        s0 = plgpu.load(s_smem.at[slot], layout=plgpu.Layout.WGMMA)
        pl.when(k + ns < count)(lambda: plgpu.barrier_arrive(sfree.at[slot]))
        for q in range(NO):
          plgpu.barrier_wait(ofull.at[fo(k, q)])
        xh, xl, bt, cc = (r.at[oslot] for r in (xh_smem, xl_smem, bt_smem, c_smem))

        def fold(acc):
          plgpu.wgmma(acc, xh, bt.T)
          plgpu.wgmma(acc, xl, bt.T)
          return acc[...]
        s1 = s0 * a_k + pl.run_scoped(fold, plgpu.ACC((P, N), f32))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the previous item's stores
        out[...] = s1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out, pool_ref.at[e, h], commit_group=False)

        def yparts(acc):
          for part in bf16_parts(s1):
            plgpu.wgmma(acc, plgpu.layout_cast(part, plgpu.Layout.WGMMA), cc.T)
          return acc[...]
        y = pl.run_scoped(yparts, plgpu.ACC((P, R), f32))
        pl.when(k + no < count)(lambda: plgpu.barrier_arrive(ofree.at[oslot]))
        ys[...] = y
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(ys, y_ref.at[b, h], commit_group=False)
        plgpu.commit_smem_to_gmem_group()
        return carry

      lax.fori_loop(0, (count - wg + nc - 1) // nc, item, scalars(wg))
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  ops = lambda shape, t, dt=f32: plgpu.SMEM((no,) + shape, dt, transforms=t)
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[plgpu.SMEM((ns, P, N), f32, transforms=swz(N * 4)),
                     ops((P, KT), swz(KT * 4)), ops((P, KT), swz(KT * 4)),
                     ops((N, KT), swz(KT * 4)),
                     ops((R, N), (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)), jnp.bfloat16),
                     plgpu.SMEM((nc, P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((nc, P, R), f32),
                     plgpu.Barrier(num_barriers=nc * Ds),
                     plgpu.Barrier(num_barriers=nc * Do * NO),
                     plgpu.Barrier(num_arrivals=1, num_barriers=ns),
                     plgpu.Barrier(num_arrivals=1, num_barriers=no)],
      grid=(ctas,), grid_names=("c",), num_threads=nc + 1, thread_name="wg",
      kernel_name="mgpu_proto_wse",
      **({"interpret": plgpu.InterpretGPUParams()} if INTERPRET else {}))

  def call(idx, a, pool, xh, xl, bt, c):
    ref = jax.new_ref(pool)
    y = kern(idx, a, ref, xh, xl, bt, c)
    return jax.ref.freeze(ref), y
  return call


NF = 5   # rows the wsf fold folds (the acceptance mix's mean is ~4.5)


def make_wsf(B, E, H=128, P=64, N=128, G=8, R=8, KT=8, ctas=132, ns=4, no=4):
  """wse with the fold as the library's elementwise recurrence over NF pending rows,
  S = S * dA_k + (dt_k x_k) B_k, from the rows as the window holds them (x and B rows in
  bf16, dt and dA per head and row); y from S1's bf16 parts (C bf16)."""
  HG, items = H // G, B * H
  ctas = min(ctas, items)
  NO, nc = 4, 2
  Ds, Do = -(-ns // nc), -(-no // nc)
  fs = lambda k: (k % nc) * Ds + (k // nc) % Ds
  fo = lambda k, q: ((k % nc) * Do + (k // nc) % Do) * NO + q
  ROW, COL = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)

  def body(idx_ref, pool_ref, xr_ref, br_ref, dd_ref, c_ref, y_ref,
           s_smem, x_smem, b_smem, dd_smem, c_smem, out_smem, y_smem,
           sfull, ofull, sfree, ofree):
    cid, wg = lax.axis_index("c"), lax.axis_index("wg")
    count = (items - cid + ctas - 1) // ctas

    def where(k):
      i = cid + k * ctas
      b, h = i // H, i % H
      return b, h, h // HG, idx_ref[b]

    @pl.when(wg == nc)
    def _producer():
      plgpu.set_max_registers(40, action="decrease")

      def state(k):
        slot = lax.rem(k, ns)
        b, h, g, e = where(k)
        pl.when(k >= ns)(lambda: plgpu.barrier_wait(sfree.at[slot]))
        plgpu.copy_gmem_to_smem(pool_ref.at[e, h], s_smem.at[slot], sfull.at[fs(k)])

      state(0)

      @pl.loop(0, count)
      def _(k):
        pl.when(k + 1 < count)(lambda: state(k + 1))
        slot = lax.rem(k, no)
        b, h, g, e = where(k)
        pl.when(k >= no)(lambda: plgpu.barrier_wait(ofree.at[slot]))
        srcs = (xr_ref.at[b, :, pl.ds(h * P, P)], br_ref.at[b, :, pl.ds(g * N, N)],
                dd_ref.at[b, h], c_ref.at[b, g])
        dsts = (x_smem, b_smem, dd_smem, c_smem)
        for j, (src, dst) in enumerate(zip(srcs, dsts)):
          plgpu.copy_gmem_to_smem(src, dst.at[slot], ofull.at[fo(k, j)])

    @pl.when(wg < nc)
    def _consumer():
      plgpu.set_max_registers(232, action="increase")
      out, ys = out_smem.at[wg], y_smem.at[wg]

      def item(j, e):
        k = wg + nc * j
        slot, oslot = lax.rem(k, ns), lax.rem(k, no)
        e_next = where(jnp.minimum(k + nc, count - 1))[3]
        b, h, g, _ = where(k)
        plgpu.barrier_wait(sfull.at[fs(k)])
        S = plgpu.load(s_smem.at[slot], layout=plgpu.Layout.WGMMA)
        pl.when(k + ns < count)(lambda: plgpu.barrier_arrive(sfree.at[slot]))
        for q in range(NO):
          plgpu.barrier_wait(ofull.at[fo(k, q)])
        xs, bs, dd, cc = (r.at[oslot] for r in (x_smem, b_smem, dd_smem, c_smem))
        for r in range(NF):
          x = plgpu.load(xs.at[r], layout=ROW).astype(f32)
          bv = plgpu.load(bs.at[r], layout=COL).astype(f32)
          dtx = x * dd[0, r]
          S = S * dd[1, r] + dtx[:, None] * bv[None, :]
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the previous item's stores
        out[...] = S
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out, pool_ref.at[e, h], commit_group=False)

        def yparts(acc):
          for part in bf16_parts(S):
            plgpu.wgmma(acc, plgpu.layout_cast(part, plgpu.Layout.WGMMA), cc.T)
          return acc[...]
        y = pl.run_scoped(yparts, plgpu.ACC((P, R), f32))
        pl.when(k + no < count)(lambda: plgpu.barrier_arrive(ofree.at[oslot]))
        ys[...] = y
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(ys, y_ref.at[b, h], commit_group=False)
        plgpu.commit_smem_to_gmem_group()
        return e_next

      lax.fori_loop(0, (count - wg + nc - 1) // nc, item, where(wg)[3])
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  bf = jnp.bfloat16
  kern = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, H, P, R), f32),
      scratch_types=[plgpu.SMEM((ns, P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((no, KT, P), bf), plgpu.SMEM((no, KT, N), bf),
                     plgpu.SMEM((no, 2, KT), f32),
                     plgpu.SMEM((no, R, N), bf, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))),
                     plgpu.SMEM((nc, P, N), f32, transforms=swz(N * 4)),
                     plgpu.SMEM((nc, P, R), f32),
                     plgpu.Barrier(num_barriers=nc * Ds),
                     plgpu.Barrier(num_barriers=nc * Do * NO),
                     plgpu.Barrier(num_arrivals=1, num_barriers=ns),
                     plgpu.Barrier(num_arrivals=1, num_barriers=no)],
      grid=(ctas,), grid_names=("c",), num_threads=nc + 1, thread_name="wg",
      kernel_name="mgpu_proto_wsf",
      **({"interpret": plgpu.InterpretGPUParams()} if INTERPRET else {}))

  def call(idx, a, pool, xr, br, dd, c):
    del a
    ref = jax.new_ref(pool)
    y = kern(idx, ref, xr, br, dd, c)
    return jax.ref.freeze(ref), y
  return call


def fold_rows_inputs(B, rng, H=128, P=64, N=128, G=8, KT=8):
  """x and B rows [B, KT, H*P] / [B, KT, G*N] (bf16), dt and dA per head and row [B, H, 2, KT]."""
  xr = jnp.asarray(rng.normal(0, 1, (B, KT, H * P)), jnp.bfloat16)
  br = jnp.asarray(rng.normal(0, 1, (B, KT, G * N)), jnp.bfloat16)
  dt = rng.uniform(0.01, 0.2, (B, H, KT)).astype(np.float32)
  da = np.exp(-dt * rng.uniform(0.5, 2.0, (B, H, 1))).astype(np.float32)
  return xr, br, jnp.asarray(np.stack([dt, da], 2))


def fold_rows_reference(pool, idx, xr, br, dd, c, H=128, P=64, N=128, G=8):
  s = pool[idx].astype(np.float64)
  x = np.asarray(xr.astype(f32), np.float64).reshape(len(idx), -1, H, P)
  bb = np.repeat(np.asarray(br.astype(f32), np.float64).reshape(len(idx), -1, G, N), H // G, axis=2)
  dd = np.asarray(dd, np.float64)
  for r in range(NF):
    s = s * dd[:, :, 1, r, None, None] + (dd[:, :, 0, r, None] * x[:, r])[..., None] * bb[:, r, :, None, :]
  cg = np.repeat(np.asarray(c.astype(f32), np.float64), H // G, axis=1)
  return s, np.einsum("bhpn,bhrn->bhpr", s, cg)


def make_step(B, E, **kw):
  v = os.environ.get("MG_VARIANT", "full")
  if v.startswith("regs"):       # regs<ctas>x<ns>
    ctas, ns = map(int, v[4:].split("x"))
    return make_regs(B, E, ctas=ctas, ns=ns, **kw)
  if v.startswith("wsr"):        # wsr<ctas>x<ns>c<nc>
    ctas, rest = v[3:].split("x"); ns, nc = rest.split("c")
    return make_wsr(B, E, ctas=int(ctas), ns=int(ns), nc=int(nc), **kw)
  if v.startswith("wsf"):        # wsf<ctas>x<ns>x<no>
    ctas, ns, no = map(int, v[3:].split("x"))
    return make_wsf(B, E, ctas=ctas, ns=ns, no=no, **kw)
  if v.startswith("wse"):        # wse<ctas>x<ns>x<no>
    ctas, ns, no = map(int, v[3:].split("x"))
    return make_wse(B, E, ctas=ctas, ns=ns, no=no, **kw)
  if v.startswith("wso"):        # wso<ctas>x<ns>
    ctas, ns = map(int, v[3:].split("x"))
    return make_wso(B, E, ctas=ctas, ns=ns, **kw)
  if v.startswith("wsb"):        # wsb<ctas>x<ns>: ws with y from S1's bf16 parts in registers
    ctas, ns = map(int, v[3:].split("x"))
    return make_ws(B, E, ctas=ctas, ns=ns, ybf16=True, **kw)
  if v.startswith("wsp"):        # wsp<ctas>x<ns>: ws with the next item's scalars prefetched
    ctas, ns = map(int, v[3:].split("x"))
    return make_ws(B, E, ctas=ctas, ns=ns, prefetch=True, **kw)
  if v.startswith("ws"):         # ws<ctas>x<ns>
    ctas, ns = map(int, v[2:].split("x"))
    return make_ws(B, E, ctas=ctas, ns=ns, **kw)
  if v.startswith("pipecopy"):   # pipecopy<ctas>x<stages>
    ctas, stages = map(int, v[8:].split("x"))
    return make_pipecopy(B, E, ctas=ctas, stages=stages, **kw)
  if v.startswith("pipe"):       # pipe<ctas>x<stages>
    ctas, stages = map(int, v[4:].split("x"))
    return make_pipe(B, E, ctas=ctas, stages=stages, **kw)
  return make_step1(B, E, **kw)


def reference(pool, idx, a, xw, bt, c):
  s0 = pool[idx].astype(np.float64)                       # [B, H, P, N]
  G = bt.shape[1]; H = pool.shape[1]
  btg = np.repeat(bt.astype(np.float64), H // G, axis=1)  # [B, H, N, K]
  cg = np.repeat(c.astype(np.float64), H // G, axis=1)    # [B, H, R, N]
  s1 = a[:, :, None, None] * s0 + np.einsum("bhpk,bhnk->bhpn", xw.astype(np.float64), btg)
  y = np.einsum("bhpn,bhrn->bhpr", s1, cg)
  return s1, y


def inputs(B, E, rng, H=128, P=64, N=128, G=8, R=8, KT=8):
  pool = rng.normal(0, 0.5, (E, H, P, N)).astype(np.float32)
  idx = rng.permutation(E)[:B].astype(np.int32)
  a = rng.uniform(0.5, 1.0, (B, H)).astype(np.float32)
  xw = rng.normal(0, 1, (B, H, P, KT)).astype(np.float32)
  bt = np.asarray(jnp.asarray(rng.normal(0, 1, (B, G, N, KT)), jnp.bfloat16).astype(f32))
  c = np.asarray(jnp.asarray(rng.normal(0, 1, (B, G, R, N)), jnp.bfloat16).astype(f32))
  return pool, idx, a, xw, bt, c


def operands(xw, bt, c):
  """The kernel's operands after (idx, a, pool) for the variant in MG_VARIANT."""
  if os.environ.get("MG_VARIANT", "full").startswith("regs"):
    pad = lambda v, axis: np.concatenate([v, np.zeros_like(v)], axis=axis)
    bw = np.swapaxes(bt, 2, 3)                                  # [B, G, K, N]
    return (jnp.asarray(pad(xw, 3)), jnp.asarray(pad(bw, 2), jnp.bfloat16),
            jnp.asarray(c, jnp.bfloat16))
  xl = np.asarray(tf32_tail(jnp.asarray(xw)))
  if os.environ.get("MG_VARIANT", "full").startswith("wsf"):
    return fold_rows_inputs(xw.shape[0], np.random.default_rng(1)) + (jnp.asarray(c, jnp.bfloat16),)
  if os.environ.get("MG_VARIANT", "full").startswith(("wsb", "wso", "wse")):
    return tuple(map(jnp.asarray, (xw - xl, xl, bt))) + (jnp.asarray(c, jnp.bfloat16),)
  if os.environ.get("MG_VARIANT", "full").startswith("ws"):
    return tuple(map(jnp.asarray, (xw - xl, xl, bt, c)))   # an explicit TF32 head
  return tuple(map(jnp.asarray, (xw, xl, bt, c)))


def main():
  rng = np.random.default_rng(0)
  B, E = (2, 4) if INTERPRET else (4, 8)
  pool, idx, a, xw, bt, c = inputs(B, E, rng)
  step = make_step(B, E)
  ops = operands(xw, bt, c)
  f = jax.jit(step)
  if len(sys.argv) > 1 and sys.argv[1] == "lower":
    sds = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (idx, a, pool) + ops]
    with jax.sharding.use_abstract_mesh(__import__("m2v_jax.kernels.backend", fromlist=["x"]).abstract_h200_mesh()):
      t = jax.jit(step).trace(*sds).lower(lowering_platforms=("cuda",)).as_text()
    print(len(t), "mosaic_gpu" in t); open("/tmp/mg_proto.mlir","w").write(t); return
  if len(sys.argv) > 1 and sys.argv[1] == "ncu":     # each launch on other entries (past the L2)
    B, E = 32, 32 * 4
    pool, idx, a, xw, bt, c = inputs(B, E, rng)
    g = jax.jit(make_step(B, E), donate_argnums=2)
    args = [jnp.asarray(idx), jnp.asarray(a), jnp.asarray(pool), *operands(xw, bt, c)]
    for k in range(4):
      args[0] = jnp.arange(B, dtype=jnp.int32) + (k % 4) * B
      args[2], y = g(*args)
    y.block_until_ready(); return
  new_pool, y = f(jnp.asarray(idx), jnp.asarray(a), jnp.asarray(pool), *ops)
  if os.environ.get("MG_VARIANT", "full").startswith("wsf"):
    s1, yr = fold_rows_reference(pool, idx, *ops)
  else:
    s1, yr = reference(pool, idx, a, xw, bt, c)
  new_pool, y = np.asarray(new_pool), np.asarray(y)
  err_s = np.abs(new_pool[idx] - s1).max() / np.abs(s1).max()
  err_y = np.abs(y - yr).max() / np.abs(yr).max()
  untouched = np.array_equal(np.delete(new_pool, idx, 0), np.delete(pool, idx, 0))
  print(f"check: state rel err {err_s:.2e}, y rel err {err_y:.2e}, other entries untouched {untouched}")
  if INTERPRET: return
  res = {}
  for B in (1, 8, 32, 128):
    banks = max(2, -(-160 * 2**20 // (B * 128 * 64 * 128 * 4)))   # rotate past the 60 MB L2
    E = B * banks
    step = make_step(B, E)
    pool, idx, a, xw, bt, c = inputs(B, E, rng)
    idxs = jnp.asarray(np.stack([np.arange(B) + k * B for k in range(banks)]).astype(np.int32))
    args = (jnp.asarray(a),) + operands(xw, bt, c)

    @functools.partial(jax.jit, donate_argnums=0, static_argnums=2)
    def loop(pool, idxs, n):
      def one(i, carry):
        pool, acc = carry
        pool, y = step(idxs[i % banks], args[0], pool, *args[1:])
        return pool, acc + y[0, 0, 0, 0]
      return lax.fori_loop(0, n, one, (pool, jnp.float32(0)))
    p = jnp.asarray(pool)
    p, s = loop(p, idxs, 20); s.block_until_ready()
    ts = []
    for rep in range(7):
      t0 = time.perf_counter(); p, s = loop(p, idxs, 200); s.block_until_ready(); ts.append((time.perf_counter() - t0) / 200 * 1e6)
    med = float(np.median(ts))
    mb = B * 128 * 64 * 128 * 4 * 2 / 1e6
    res[B] = dict(median_us=med, min_us=min(ts), state_MB=mb, GBps=mb * 1e3 / med, floor_us_at_4p04=mb / 4.04e6 * 1e6)
    print(f"B={B}: {med:.1f} us (min {min(ts):.1f}); state traffic {mb:.1f} MB -> {mb*1e3/med:.0f} GB/s; floor at 4.04 TB/s {mb/4.04e6*1e6:.1f} us")
  json.dump(res, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mg_proto.json", "w"), indent=1)


if __name__ == "__main__":
  main()

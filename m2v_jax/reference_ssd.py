"""The dense chunked (SSD) recurrence in jax.numpy: the chunked prefill's baseline and the
example model's training path."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from m2v_jax import reference
from m2v_jax.kernels import rowmath

f32 = jnp.float32


def ssd_chunked(cfg, params, ssm0, conv0, xbc, dt, z=None, chunk: int = 64,
                precision=lax.Precision.HIGHEST):
  """SSD chunked scan of R rows (Dao & Gu, "Transformers are SSMs", 2024, §6), with einsums.

  Args:
    cfg, params, ssm0 [B, H, P, N], conv0 [B, C, K-1], xbc [B, R, C], dt [B, R, H], z: as
      `reference.rows`.
    chunk: rows per chunk; R is padded with dt = 0 rows (no decay, no input).
    precision: of every matmul.

  Returns:
    y [B, R, H*P], final ssm [B, H, P, N], final conv [B, C, K-1], all float32.
  """
  Bsz, R, _ = xbc.shape
  H, P, N, G = cfg.nheads, cfg.headdim, cfg.dstate, cfg.ngroups
  HP, GN = cfg.d_inner, G * N
  out, conv_f = reference.conv_prefill(cfg, params, conv0, xbc)
  x = out[..., :HP].reshape(Bsz, R, H, P)
  bm = out[..., HP:HP + GN].reshape(Bsz, R, G, N)
  cm = out[..., HP + GN:].reshape(Bsz, R, G, N)
  dtp = rowmath.process_dt(dt.astype(f32), params.dt_bias, cfg.dt_limit)     # [B, R, H]
  A = -jnp.exp(params.A_log)
  nc = -(-R // chunk)
  pad = nc * chunk - R
  padr = lambda a: jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
  x, bm, cm = padr(x), padr(bm), padr(cm)
  dtp = padr(dtp)
  L = chunk
  x = x.reshape(Bsz, nc, L, H, P)
  bm = jnp.repeat(bm.reshape(Bsz, nc, L, G, N), cfg.heads_per_group, axis=3)
  cm = jnp.repeat(cm.reshape(Bsz, nc, L, G, N), cfg.heads_per_group, axis=3)
  dtp = dtp.reshape(Bsz, nc, L, H)
  a = dtp * A                                                     # log decay per row
  acum = jnp.cumsum(a, axis=2)                                    # [B, nc, L, H]
  ein = lambda s, *o: jnp.einsum(s, *o, precision=precision)
  # Intra-chunk: y_t += sum_{s<=t} (C_t·B_s) exp(acum_t - acum_s) dt_s x_s
  seg = acum[:, :, :, None, :] - acum[:, :, None, :, :]           # [B, nc, t, s, H]
  causal = jnp.tril(jnp.ones((L, L), bool))[None, None, :, :, None]
  decay_ts = jnp.where(causal, jnp.exp(jnp.where(causal, seg, 0.0)), 0.0)
  cb = ein("bctgn,bcsgn->bctsg", cm, bm)                          # [B, nc, t, s, H]
  w = cb * decay_ts * dtp[:, :, None, :, :]
  y = ein("bctsh,bcshp->bcthp", w, x)
  # Chunk states (from zero): S_c = sum_s exp(acum_L - acum_s) dt_s x_s B_s^T
  tail = jnp.exp(acum[:, :, -1:, :] - acum) * dtp                 # [B, nc, L, H]
  chunk_states = ein("bclh,bclhp,bclhn->bchpn", tail, x, bm)
  chunk_decay = jnp.exp(acum[:, :, -1, :])                        # [B, nc, H]

  def pass_state(st, inp):
    cs, cd = inp
    return st * cd[..., None, None] + cs, st

  final, starts = lax.scan(pass_state, ssm0.astype(f32),
                           (jnp.swapaxes(chunk_states, 0, 1), jnp.swapaxes(chunk_decay, 0, 1)))
  starts = jnp.swapaxes(starts, 0, 1)                             # [B, nc, H, P, N]
  y = y + ein("bclhn,bchpn->bclhp", cm, starts) * jnp.exp(acum)[..., None]
  y = y + params.D[:, None] * x
  y = y.reshape(Bsz, nc * L, HP)[:, :R]
  if z is not None:
    y = rowmath.gate(y, z.astype(f32))
  return y, final, conv_f

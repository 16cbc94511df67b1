"""The ops and the mixer layer under `jax.shard_map`: heads and sequences split over mesh axes.

The sharded ops take the conv channels in the TP layout `[x_0 | B_0 | C_0 | x_1 | ...]`
(`to_tp_layout`), so a contiguous split gives each device its own `[x | B | C]`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from m2v_jax import config as config_lib
from m2v_jax import layer as layer_lib
from m2v_jax import ops
from m2v_jax.params import LayerParams
from m2v_jax.state import CompactState, SnapshotState


def local_config(cfg: config_lib.Mamba2Config, n: int) -> config_lib.Mamba2Config:
  """The geometry one of n head shards sees; ValueError unless n divides nheads and ngroups."""
  if cfg.nheads % n or cfg.ngroups % n:
    raise ValueError(f"head shards: expected a divisor of nheads={cfg.nheads} and "
                     f"ngroups={cfg.ngroups}, got {n}")
  return cfg.replace(nheads=cfg.nheads // n, ngroups=cfg.ngroups // n)


def tp_channel_order(cfg: config_lib.Mamba2Config, n: int) -> np.ndarray:
  """Indices into the global conv channels, in TP layout order."""
  lc = local_config(cfg, n)
  HP, GN = cfg.d_inner, cfg.ngroups * cfg.dstate
  hp, gn = lc.d_inner, lc.ngroups * lc.dstate
  order = []
  for d in range(n):
    order += [np.arange(d * hp, (d + 1) * hp), HP + np.arange(d * gn, (d + 1) * gn),
              HP + GN + np.arange(d * gn, (d + 1) * gn)]
  return np.concatenate(order)


# Per parameter: (conv-channel axis, whether only x and B channels), or None.
_CHANNEL_AXIS = {
    "conv_weight": (0, False), "conv_bias": (0, False), "dt_bias": None, "A_log": None,
    "D": None,
}


def _take(a, order, axis):
  """`jnp.take` along the channel axis; an Explicit-sharded array is replicated first."""
  sharding = jax.typeof(a).sharding
  if any(s is not None for s in getattr(sharding, "spec", ())):
    a = jax.reshard(a, NamedSharding(sharding.mesh, P()))
  return jnp.take(a, order, axis=axis)


def _permute(tree, specs):
  return type(tree)(*(leaf if spec is None else _take(leaf, spec[1], spec[0])
                      for leaf, spec in zip(tree, specs)))


def _state_channel_axes(state):
  """Per state leaf: (channel axis, whether only x and B channels), or None."""
  if isinstance(state, SnapshotState):
    return (None, (2, False))
  return (None, (1, False), (2, False), (2, True), None, None, None, None, None)


def _xb(order, cfg):
  """The x and B channels of `order` (the columns of `CompactState.win_xb`)."""
  return order[order < cfg.d_inner + cfg.ngroups * cfg.dstate]


def to_tp_layout(cfg, n, *, params=None, state=None, xbc=None):
  """Permutes the conv-channel axis of the given params, state, xbc into TP layout.

  Returns (params, state, xbc), None for those not given.
  """
  order = tp_channel_order(cfg, n)
  return _apply(order, _xb(order, cfg), params, state, xbc)


def from_tp_layout(cfg, n, *, params=None, state=None, xbc=None):
  """The inverse of `to_tp_layout`."""
  order = tp_channel_order(cfg, n)
  return _apply(np.argsort(order), np.argsort(_xb(order, cfg)), params, state, xbc)


def _apply(order, xb_order, params, state, xbc):
  specs = lambda axes: [None if a is None else (a[0], xb_order if a[1] else order)
                        for a in axes]
  out_p = None if params is None else _permute(
      params, specs([_CHANNEL_AXIS[f] for f in LayerParams._fields]))
  out_s = None if state is None else _permute(state, specs(_state_channel_axes(state)))
  out_x = None if xbc is None else _take(xbc, order, xbc.ndim - 1)
  return out_p, out_s, out_x


def _specs(state, h, b):
  params = LayerParams(conv_weight=P(h, None), conv_bias=P(h), dt_bias=P(h), A_log=P(h), D=P(h))
  if isinstance(state, SnapshotState):
    st = SnapshotState(ssm=P(b, None, h), conv=P(b, None, h))
  else:
    st = CompactState(ssm=P(b, h), conv=P(b, h), last_xbc=P(b, None, h), win_xb=P(b, None, h),
                      win_dt=P(b, None, h), pending=P(b), starts=P(b), origin=P(b),
                      last_bits=P(b))
  return params, st


def _mixer_specs(ssm_spec, h):
  return layer_lib.MixerParams(in_proj=P(None, h), ssm=ssm_spec, norm_weight=P(h),
                               out_proj=P(h, None))


def put(mesh: jax.sharding.Mesh, *, head_axis: str, batch_axis: str | None = None, params=None,
        state=None):
  """Places params and a pool (TP layout) on `mesh` as `sharded` / `sharded_mixer` split them.

  `params`: `LayerParams` (`to_tp_layout`), `MixerParams` (`mixer_to_tp_layout`) or None;
  `state`: a pool in TP layout or None. Returns (params, state), None for those not given.
  """
  leaf_specs = lambda tree, specs: jax.tree.map(
      lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec)), tree, specs)
  p_spec, s_spec = _specs(state, head_axis, batch_axis)
  if isinstance(params, layer_lib.MixerParams):
    p_spec = _mixer_specs(p_spec, head_axis)
  return (None if params is None else leaf_specs(params, p_spec),
          None if state is None else leaf_specs(state, s_spec))


def _explicit(mesh, axes) -> bool:
  """Whether the mesh axes `axes` are Explicit rather than Auto; ValueError if mixed."""
  kinds = {mesh.axis_types[mesh.axis_names.index(a)] for a in axes}
  if len(kinds) > 1:
    raise ValueError(f"mesh axes {axes}: expected one axis type for all of them, got "
                     f"{sorted(map(str, kinds))}")
  return kinds == {jax.sharding.AxisType.Explicit}


def _shard_call(mesh, explicit: bool, local, args, in_specs, out_specs):
  """`local(*args)` under `jax.shard_map`; with Explicit axes the args are resharded first."""
  if explicit:
    args = jax.tree.map(lambda a, spec: jax.reshard(a, NamedSharding(mesh, spec)), args,
                        in_specs)
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)(*args)


def sharded(op, mesh: jax.sharding.Mesh, cfg: config_lib.Mamba2Config, *, head_axis: str,
            batch_axis: str | None = None, **op_kwargs):
  """`op` (`m2v_jax.verify`, `m2v_jax.prefill` or `m2v_jax.prefill_packed`) on global arrays,
  sharded.

  Returns `f(params, state, xbc, dt, state_row, z=None, parents=None) -> (y, state)` on global
  arrays in TP layout (`to_tp_layout`): heads over `head_axis`, sequences and pool entries
  (and a verify call's draft tree, `parents` [B, R], whose values are checked on the device
  only: a sequence whose parents break the rule is rejected) over `batch_axis`; for
  `prefill_packed`, `f(params, state, xbc, dt, cu_seqlens, state_row, z=None)` with heads
  sharded only (prompt s in pool entry s: E == S). Jit it with the state donated. Auto and
  Explicit mesh axes both work.

      mesh = jax.make_mesh((2,), ("tp",))
      step = jax.jit(sharded(m2v_jax.verify, mesh, cfg, head_axis="tp"), donate_argnums=1)
      params_tp, state_tp, _ = to_tp_layout(cfg, 2, params=params, state=state)
      params_tp, state_tp = put(mesh, head_axis="tp", params=params_tp, state=state_tp)
      _, _, xbc_tp = to_tp_layout(cfg, 2, xbc=xbc)
      y, state_tp = step(params_tp, state_tp, xbc_tp, dt, state_row)

  Args:
    op: the single-device op.
    mesh: a mesh with `head_axis` (and `batch_axis`).
    cfg: the global geometry.
    head_axis: mesh axis of the heads.
    batch_axis: mesh axis of the sequences (None: replicated).
    **op_kwargs: passed to `op` (e.g. `backend=`).

  Raises:
    ValueError: the head-axis size does not divide nheads and ngroups; mixed axis types; a
      batch_axis with `prefill_packed`.
  """
  n = mesh.shape[head_axis]
  lcfg = local_config(cfg, n)
  h, b = head_axis, batch_axis
  explicit = _explicit(mesh, [a for a in (h, b) if a is not None])

  if op is ops.prefill_packed:
    if b is not None:
      raise ValueError("batch_axis: a packed prefill's rows are not split by sequence; shard "
                       "its heads only (batch_axis=None)")

    def run_packed(params, state, xbc, dt, cu_seqlens, state_row, z=None):
      p_spec, s_spec = _specs(state, h, None)
      x_spec = P(None, h)
      in_specs = (p_spec, s_spec, x_spec, x_spec, P(), P()) + ((x_spec,) if z is not None else ())
      args = (params, state, xbc, dt, cu_seqlens, state_row) + ((z,) if z is not None else ())
      local = lambda p, s, x, d, cu, r, *zz: op(lcfg, p, s, x, d, cu, state_row=r,
                                                z=zz[0] if zz else None, **op_kwargs)
      return _shard_call(mesh, explicit, local, args, in_specs, (x_spec, s_spec))

    return run_packed

  def run(params, state, xbc, dt, state_row, z=None, parents=None):
    p_spec, s_spec = _specs(state, h, b)
    x_spec = P(b, None, h)
    extra = {k: v for k, v in (("z", z), ("parents", parents)) if v is not None}
    specs = {"z": x_spec, "parents": P(b, None)}
    in_specs = (p_spec, s_spec, x_spec, x_spec, P(b)) + tuple(specs[k] for k in extra)

    def local(p, s, x, d, r, *rest):
      return op(lcfg, p, s, x, d, r, **dict(zip(extra, rest)), **op_kwargs)

    args = (params, state, xbc, dt, state_row) + tuple(extra.values())
    return _shard_call(mesh, explicit, local, args, in_specs, (x_spec, s_spec))

  return run


def _local_mixer_config(cfg: layer_lib.MixerConfig, n: int) -> layer_lib.MixerConfig:
  if cfg.groups % n:
    raise ValueError(f"head shards: expected a divisor of the gated norm's groups="
                     f"{cfg.groups}, got {n}")
  return dataclasses.replace(cfg, ssm=local_config(cfg.ssm, n), norm_groups=cfg.groups // n)


def mixer_to_tp_layout(cfg: layer_lib.MixerConfig, n: int, params: layer_lib.MixerParams
                       ) -> layer_lib.MixerParams:
  """Mixer params with in_proj's output columns in TP layout: `[z_d | x_d | B_d | C_d | dt_d]`.

  Take the state through `to_tp_layout(cfg.ssm, n, state=...)`. Raises ValueError unless n
  divides nheads, ngroups and the norm's groups.
  """
  _local_mixer_config(cfg, n)
  di, C, H = cfg.d_inner, cfg.ssm.conv_dim, cfg.ssm.nheads
  conv = tp_channel_order(cfg.ssm, n).reshape(n, C // n)
  cols = np.concatenate([np.concatenate([np.arange(d * di // n, (d + 1) * di // n), di + conv[d],
                                         di + C + np.arange(d * H // n, (d + 1) * H // n)])
                         for d in range(n)])
  ssm, _, _ = to_tp_layout(cfg.ssm, n, params=params.ssm)
  return params._replace(in_proj=_take(params.in_proj, cols, 1), ssm=ssm)


def sharded_mixer(mesh: jax.sharding.Mesh, cfg: layer_lib.MixerConfig, *, head_axis: str,
                  batch_axis: str | None = None, **mixer_kwargs):
  """The mixer layer (`layer.mixer`) on global arrays, sharded as `sharded` shards an op.

  Returns `f(params, state, hidden, state_row, parents=None) -> (out, state)`: params from
  `mixer_to_tp_layout`, the pool from `to_tp_layout`; hidden [B, R, d_model] and out
  replicated over the head axis, the shards' float32 partial outputs summed by `lax.psum`.
  `mixer_kwargs` go to `layer.mixer_partial` (`prefill`, `chunked`, `backend`).

  Raises:
    ValueError: the head-axis size does not divide nheads, ngroups and the norm's groups;
      `cache_indices`, `num_rows`, `state_row` or `out_dtype` among mixer_kwargs.
  """
  for key in ("cache_indices", "num_rows", "state_row"):
    if key in mixer_kwargs:
      raise ValueError(f"{key}: per-sequence arrays are not taken by sharded_mixer (they "
                       f"would not be split with the sequences)")
  if "out_dtype" in mixer_kwargs:
    raise ValueError("out_dtype: sharded_mixer sums the shards' float32 partial outputs, then "
                     "casts to the activation dtype")
  n = mesh.shape[head_axis]
  lcfg = _local_mixer_config(cfg, n)
  h, b = head_axis, batch_axis
  explicit = _explicit(mesh, [a for a in (h, b) if a is not None])

  def run(params, state, hidden, state_row, parents=None):
    layer_lib.check_params(cfg, params)
    ssm_spec, s_spec = _specs(state, h, b)
    p_spec = _mixer_specs(ssm_spec, h)
    tree = () if parents is None else (parents,)
    in_specs = (p_spec, s_spec, P(b, None, None), P(b)) + ((P(b, None),) if tree else ())

    def local(p, s, x, r, *par):
      out, s = layer_lib.mixer_partial(lcfg, p, s, x, r, parents=par[0] if par else None,
                                       **mixer_kwargs)
      return jax.lax.psum(out, h).astype(x.dtype), s

    return _shard_call(mesh, explicit, local, (params, state, hidden, state_row) + tree,
                       in_specs, (P(b, None, None), s_spec))

  return run

"""Tensor- and data-parallel execution of the ops with `jax.shard_map`.

Heads are split across the mesh axis `head_axis` (tensor parallel: each device holds H/n
heads, their G/n groups and their conv channels) and sequences across `batch_axis`. No state
is gathered: every device runs the unchanged single-device op on its shard, with the local
geometry `local_config(cfg, n)`.

The conv channels of the global layout `[x (H*P) | B (G*N) | C (G*N)]` are not contiguous per
device, so the sharded ops take them in the TP layout `[x_0 | B_0 | C_0 | x_1 | B_1 | C_1 |
...]` (device d's own `[x | B | C]` block after block), which a contiguous split along the
channel axis hands out correctly. `to_tp_layout` / `from_tp_layout` permute the channel axis
of parameters, states and xBC between the two layouts; a model's in_proj can emit the TP
layout directly by permuting its output columns once: `mixer_to_tp_layout` does that for the
mixer layer (`m2v_jax.layer`), and `sharded_mixer` runs it with out_proj's partial sums added
across the head shards.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from m2v_jax import config as config_lib
from m2v_jax import layer as layer_lib
from m2v_jax.params import LayerParams
from m2v_jax.state import CompactState, SnapshotState


def local_config(cfg: config_lib.Mamba2Config, n: int) -> config_lib.Mamba2Config:
  """The geometry one of n head shards sees.

  Raises:
    ValueError: n does not divide nheads and ngroups.
  """
  if cfg.nheads % n or cfg.ngroups % n:
    raise ValueError(f"head shards: expected a divisor of nheads={cfg.nheads} and "
                     f"ngroups={cfg.ngroups}, got {n}")
  return cfg.replace(nheads=cfg.nheads // n, ngroups=cfg.ngroups // n)


def tp_channel_order(cfg: config_lib.Mamba2Config, n: int) -> np.ndarray:
  """Indices into the global conv channels, in TP layout order (see the module docstring)."""
  lc = local_config(cfg, n)
  HP, GN = cfg.d_inner, cfg.ngroups * cfg.dstate
  hp, gn = lc.d_inner, lc.ngroups * lc.dstate
  order = []
  for d in range(n):
    order += [np.arange(d * hp, (d + 1) * hp), HP + np.arange(d * gn, (d + 1) * gn),
              HP + GN + np.arange(d * gn, (d + 1) * gn)]
  return np.concatenate(order)


# Per parameter: (its conv-channel axis, whether it holds only the x and B channels), or None.
_CHANNEL_AXIS = {
    "conv_weight": (0, False), "conv_bias": (0, False), "dt_bias": None, "A_log": None,
    "D": None,
}


def _take(a, order, axis):
  """`jnp.take` along the channel axis. An array sharded over Explicit mesh axes is
  replicated first: the permutation moves channels between devices."""
  sharding = jax.typeof(a).sharding
  if any(s is not None for s in getattr(sharding, "spec", ())):
    a = jax.reshard(a, NamedSharding(sharding.mesh, P()))
  return jnp.take(a, order, axis=axis)


def _permute(tree, specs):
  """Each leaf permuted by its spec, (channel axis, order), or left as it is (None)."""
  return type(tree)(*(leaf if spec is None else _take(leaf, spec[1], spec[0])
                      for leaf, spec in zip(tree, specs)))


def _state_channel_axes(state):
  """Per state leaf: (its channel axis, whether it holds only the x and B channels), or None."""
  if isinstance(state, SnapshotState):
    return (None, (2, False))
  return (None, (1, False), (2, False), (2, True), None, None, None, None)


def _xb(order, cfg):
  """The x and B channels of the channel order `order`, as columns of the compact ring's
  x|B rows (`CompactState.win_xb`, whose columns are the first H*P + G*N channels)."""
  return order[order < cfg.d_inner + cfg.ngroups * cfg.dstate]


def to_tp_layout(cfg, n, *, params=None, state=None, xbc=None):
  """Permutes the conv-channel axis of whichever of params, state, xbc are given into TP
  layout. Returns them in that order (None for those not given)."""
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
                      win_dt=P(b, None, h), pending=P(b), starts=P(b), origin=P(b))
  return params, st


def _mixer_specs(ssm_spec, h):
  return layer_lib.MixerParams(in_proj=P(None, h), ssm=ssm_spec, norm_weight=P(h),
                               out_proj=P(h, None))


def put(mesh: jax.sharding.Mesh, *, head_axis: str, batch_axis: str | None = None, params=None,
        state=None):
  """Places params and a state pool (both in TP layout) on `mesh` as `sharded` (or, for
  `MixerParams`, `sharded_mixer`) splits them, so that the first sharded call can update the
  state in place.

  Args:
    mesh, head_axis, batch_axis: as `sharded`.
    params: `LayerParams` (`to_tp_layout`) or `MixerParams` (`mixer_to_tp_layout`), or None.
    state: a state pool in TP layout, or None.

  Returns:
    (params, state) placed on the mesh (None for those not given).
  """
  leaf_specs = lambda tree, specs: jax.tree.map(
      lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec)), tree, specs)
  p_spec, s_spec = _specs(state, head_axis, batch_axis)
  if isinstance(params, layer_lib.MixerParams):
    p_spec = _mixer_specs(p_spec, head_axis)
  return (None if params is None else leaf_specs(params, p_spec),
          None if state is None else leaf_specs(state, s_spec))


def _explicit(mesh, axes) -> bool:
  """Whether the mesh axes `axes` are Explicit (as `jax.make_mesh` makes them by default)
  rather than Auto (a plain `jax.sharding.Mesh`)."""
  kinds = {mesh.axis_types[mesh.axis_names.index(a)] for a in axes}
  if len(kinds) > 1:
    raise ValueError(f"mesh axes {axes}: expected one axis type for all of them, got "
                     f"{sorted(map(str, kinds))}")
  return kinds == {jax.sharding.AxisType.Explicit}


def _shard_call(mesh, explicit: bool, local, args, in_specs, out_specs):
  """`local(*args)` under `jax.shard_map` with these specs; with Explicit mesh axes the
  arguments are resharded to `in_specs` first (a no-op when they already have them)."""
  if explicit:
    args = jax.tree.map(lambda a, spec: jax.reshard(a, NamedSharding(mesh, spec)), args,
                        in_specs)
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)(*args)


def sharded(op, mesh: jax.sharding.Mesh, cfg: config_lib.Mamba2Config, *, head_axis: str,
            batch_axis: str | None = None, **op_kwargs):
  """`op` (`m2v_jax.verify` or `m2v_jax.prefill`) as a function of global arrays, sharded.

  Returns `f(params, state, xbc, dt, state_row, z=None) -> (y, state)` on global arrays in TP
  layout: params, state and xbc permuted by `to_tp_layout`, heads split over `head_axis`,
  sequences (and the state pool's entries) over `batch_axis`. Call it under `jax.jit` with
  the state donated to update the shards in place. The mesh may have Auto axes (a
  `jax.sharding.Mesh`) or Explicit ones (the default of `jax.make_mesh`); with Explicit
  axes the arguments are resharded to the layout above first (a no-op when they already
  have it).

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
    head_axis: mesh axis the heads are split over.
    batch_axis: mesh axis the sequences are split over (None: replicated).
    **op_kwargs: passed to `op` (for example `backend=`).

  Raises:
    ValueError: the head-axis size does not divide nheads and ngroups; head and batch axes
      of different axis types.
  """
  n = mesh.shape[head_axis]
  lcfg = local_config(cfg, n)
  h, b = head_axis, batch_axis
  explicit = _explicit(mesh, [a for a in (h, b) if a is not None])

  def run(params, state, xbc, dt, state_row, z=None):
    p_spec, s_spec = _specs(state, h, b)
    x_spec = P(b, None, h)
    in_specs = (p_spec, s_spec, x_spec, x_spec, P(b)) + ((x_spec,) if z is not None else ())
    args = (params, state, xbc, dt, state_row) + ((z,) if z is not None else ())
    local = lambda p, s, x, d, r, *zz: op(lcfg, p, s, x, d, r, z=zz[0] if zz else None,
                                          **op_kwargs)
    return _shard_call(mesh, explicit, local, args, in_specs, (x_spec, s_spec))

  return run


def _local_mixer_config(cfg: layer_lib.MixerConfig, n: int) -> layer_lib.MixerConfig:
  if cfg.groups % n:
    raise ValueError(f"head shards: expected a divisor of the gated norm's groups="
                     f"{cfg.groups}, got {n}")
  return dataclasses.replace(cfg, ssm=local_config(cfg.ssm, n), norm_groups=cfg.groups // n)


def mixer_to_tp_layout(cfg: layer_lib.MixerConfig, n: int, params: layer_lib.MixerParams
                       ) -> layer_lib.MixerParams:
  """Mixer params with in_proj's output columns in TP layout: device d's `[z_d | x_d | B_d |
  C_d | dt_d]` block after block, so a contiguous split hands each head shard its own z,
  xBC (the conv channels in TP layout, as `to_tp_layout`) and dt. The conv + SSM params are
  permuted by `to_tp_layout`; the norm weight and out_proj's rows follow the heads in order
  and stay as they are. Take the state through `to_tp_layout(cfg.ssm, n, state=...)`.

  Raises:
    ValueError: n does not divide nheads, ngroups and the gated norm's groups.
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
  """The mixer layer (`m2v_jax.layer.mixer`) as a function of global arrays, heads split over
  `head_axis` and sequences over `batch_axis`.

  Returns `f(params, state, hidden, state_row) -> (out, state)`: params from
  `mixer_to_tp_layout`, the state pool from `to_tp_layout` (placed by `put`), hidden [B, R,
  d_model] and out replicated over the head axis. Each head shard runs in_proj's columns of
  its heads, the conv + SSM op on its heads, the gated norm of its groups and out_proj's rows
  of its heads; the float32 partial outputs are summed across the shards (`lax.psum`) and
  cast to hidden's dtype. The state is bitwise what the one-device op gives for the same
  xBC and dt; out differs from one device by the order of out_proj's sum (float32 rounding).
  Call it under `jax.jit` with the state donated.

  Args:
    mesh, head_axis, batch_axis: as `sharded`.
    cfg: the global layer.
    **mixer_kwargs: passed to `mixer` (`prefill`, `chunked`, `backend`).

  Raises:
    ValueError: the head-axis size does not divide nheads, ngroups and the norm's groups;
      `cache_indices` or `num_rows` among mixer_kwargs.
  """
  for key in ("cache_indices", "num_rows", "state_row"):
    if key in mixer_kwargs:
      raise ValueError(f"{key}: per-sequence arrays are not taken by sharded_mixer (they "
                       f"would not be split with the sequences)")
  n = mesh.shape[head_axis]
  lcfg = _local_mixer_config(cfg, n)
  h, b = head_axis, batch_axis
  explicit = _explicit(mesh, [a for a in (h, b) if a is not None])

  def run(params, state, hidden, state_row):
    layer_lib.check_params(cfg, params)
    ssm_spec, s_spec = _specs(state, h, b)
    p_spec = _mixer_specs(ssm_spec, h)
    in_specs = (p_spec, s_spec, P(b, None, None), P(b))

    def local(p, s, x, r):
      out, s = layer_lib.mixer_partial(lcfg, p, s, x, r, **mixer_kwargs)
      return jax.lax.psum(out, h).astype(x.dtype), s

    return _shard_call(mesh, explicit, local, (params, state, hidden, state_row), in_specs,
                       (P(b, None, None), s_spec))

  return run

import os, json, jax, jax.numpy as jnp
from m2v_jax import bench, config as C, state as state_lib, params as params_lib
out = os.environ.get("OUT", "/tmp")
cfg = C.BOLT
B, R = 1, 4096
params = params_lib.random_params(cfg)
xbc, dt = bench._inputs(cfg, B, R, jnp.bfloat16)
fn = bench.verify_fn(cfg, B, R, 0, C.PALLAS, chunked=True)
st = state_lib.init_state(cfg, B, jnp.bfloat16)
comp = jax.jit(fn, donate_argnums=0).lower(st, params, xbc, dt).compile()
open(f"{out}/chunked_hlo.txt", "w").write(comp.as_text())
c, _ = bench.verify_case(cfg, B, R, 0, 2, jnp.bfloat16, min_calls=1, chunked=True)
kt = bench.kernel_times(c, steps=5)
print(json.dumps(kt, indent=1))
json.dump(kt, open(f"{out}/kt.json", "w"), indent=1)

"""Adding an optimiser's update to the weights, rounded to nearest or stochastically.

A bfloat16 weight has 8 significant bits: neighbouring values are 0.4–0.8% of the weight's
magnitude apart, so an update smaller than half of that — a 1e-6 step on a weight of 0.02 is
0.005% of it — rounds back to the same weight and is lost, every step.
Stochastic rounding (`algo.weight_rounding="stochastic"`) rounds the float32 sum up or down at
random, up with probability equal to its distance from the value below over the spacing, so
the expected new weight is the float32 sum: small updates move the weights on average as in
float32, at the memory of bfloat16 weights. Float32 weights are updated as `optax` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

WEIGHT_ROUNDINGS = ("nearest", "stochastic")


def round_to_bfloat16_stochastically(x: jax.Array, key: jax.Array) -> jax.Array:
    """float32 `x` to bfloat16, each entry rounded towards the next bfloat16 value away from
    zero with probability (|x| − |below|) / spacing, else towards zero.

    A bfloat16 value is a float32 whose low 16 bits are zero: adding 16 uniform random bits to
    the float32 bit pattern and clearing the low 16 carries into the kept bits exactly with
    that probability (the sign bit is untouched, so it is symmetric about zero)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    noise = jax.random.bits(key, x.shape, jnp.uint32) >> 16
    kept = (bits + noise) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(kept, jnp.float32).astype(jnp.bfloat16)


def apply_updates(params, updates, key: jax.Array | None = None):
    """`params + updates`, each leaf back in its own dtype: rounded to nearest (as
    `optax.apply_updates`) when `key` is None; with a key, bfloat16 leaves are rounded
    stochastically (one key per leaf, folded from `key`) and others to nearest."""
    if key is None:
        return optax.apply_updates(params, updates)
    leaves, treedef = jax.tree.flatten(params)
    new = []
    for i, (p, u) in enumerate(zip(leaves, treedef.flatten_up_to(updates))):
        if p.dtype == jnp.bfloat16:
            total = p.astype(jnp.float32) + u.astype(jnp.float32)
            new.append(round_to_bfloat16_stochastically(total, jax.random.fold_in(key, i)))
        else:
            new.append(optax.apply_updates(p, u))
    return treedef.unflatten(new)

"""PPO's critic: the policy's decoder as a backbone, with a scalar value head.

The backbone starts as a copy of the policy's weights (as verl's critic starts from the
actor's checkpoint); the head starts at zero, so the first values are exactly 0 and the
critic learns the return scale from there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core.sharding import FSDP
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import Decoder


class ValueModel(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.backbone = Decoder(cfg, rngs=rngs)
        self.value_head = nnx.Param(jnp.zeros((cfg.hidden_size,), jnp.dtype(cfg.param_dtype)),
                                    out_sharding=(FSDP,), eager_sharding=False)

    def values(self, hidden: jax.Array) -> jax.Array:
        """f32 values for backbone hidden states [..., hidden_size]."""
        return jnp.einsum("...d,d->...", hidden, self.value_head[...].astype(hidden.dtype),
                          preferred_element_type=jnp.float32)


def critic_from_policy(policy: Decoder) -> ValueModel:
    """A critic whose backbone is a copy of `policy` (weights copied, not shared)."""
    critic = nnx.eval_shape(lambda: ValueModel(policy.cfg, rngs=nnx.Rngs(0)))
    backbone_state = jax.tree.map(jnp.copy, nnx.state(policy))
    nnx.update(critic.backbone, backbone_state)
    critic.value_head = nnx.Param(jnp.zeros((policy.cfg.hidden_size,), jnp.dtype(policy.cfg.param_dtype)),
                                  out_sharding=(FSDP,), eager_sharding=False)
    return critic

"""`algo.micro_batch_size="auto"`: the largest micro-batch whose compiled forward+backward fits
the device, chosen once when the train step is built.

One micro-batch's forward+backward (`compile_gradient`, also the planner's piece) is compiled
with the run's model and mesh for candidate sizes, and XLA's buffer assignment says what one
device holds (`memory_analysis()`). A candidate fits when

    temporaries + 2 × outputs + the micro-batch's inputs + the train state  <=  SAFETY × limit

all per device: the temporaries are the activations and the backward's buffers; the outputs
are one micro-batch's gradients, counted twice because the update also carries their running
sum; the train state is what stays resident through the update (parameters, optimiser
moments, critic, reference: `Trainer.abstract_state`). Not counted, left to the safety margin:
the rollout's batch, the reference's forward (KL) and the critic's own pass (PPO), which runs
after the actor's. The limit is `algo.micro_batch_memory_gib`, else the device's
`memory_stats()["bytes_limit"]` (GPU, TPU); a backend without one (CPU) takes the whole
minibatch. On a CPU, XLA computes bfloat16 in float32 and does not rematerialise for memory,
so its bytes are larger than a GPU's for the same program.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from ragen_jax.core import distributed, sharding
from ragen_jax.core.errors import ConfigError
from ragen_jax.models import lora as lora_lib
from ragen_jax.rl.algorithms import AUTO, AlgoConfig
from ragen_jax.rl.batch import Batch, policy_logprobs

SAFETY = 0.9  # the share of the device's memory the update may plan for


def abstract_params(state: nnx.State, mesh) -> nnx.State:
    """A model state as ShapeDtypeStructs placed by the partition rules on `mesh` (unplaced
    without one): what the compiles take, nothing allocated."""
    if mesh is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                        sharding.module_shardings(state, mesh))


def micro_batch_inputs(rows: int, length: int, generated: int, mesh) -> Batch:
    """One micro-batch of `rows` token buffers of `length` slots with `generated` loss slots,
    as ShapeDtypeStructs; its rows split over data×fsdp when they divide, as the update's are."""
    split = mesh is not None and rows % sharding.row_shards(mesh) == 0

    def array(shape, dtype):
        if mesh is None:
            return jax.ShapeDtypeStruct(shape, dtype)
        spec = jax.sharding.PartitionSpec(sharding.ROWS if split else None, *([None] * (len(shape) - 1)))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec))

    f32, i32 = jnp.float32, jnp.int32
    k = generated
    return Batch(tokens=array((rows, length), i32), mask=array((rows, length), bool), query=array((rows, k), i32),
                 targets=array((rows, k), i32), loss_mask=array((rows, k), bool), old_logprobs=array((rows, k), f32),
                 rewards=array((rows, k), f32), advantages=array((rows, k), f32), returns=array((rows, k), f32),
                 old_values=array((rows, k), f32))


def compile_gradient(graph, params, batch: Batch, mesh, lora: bool = False):
    """Compile one micro-batch's forward+backward of the policy (`graph` with `params`, both
    abstract or real) on `batch`, traced under `mesh` as the step is: the gradient of
    advantage-weighted log-probs plus an entropy term (the actor loss's shape; its elementwise
    clipping costs nothing next to the forward). With `lora` only the adapters' gradients,
    the base weights an input."""

    def loss(params, b, frozen=None):
        whole = params if frozen is None else lora_lib.join(params, frozen)
        logp, entropy = policy_logprobs(nnx.merge(graph, whole), b, 1.0)
        return jnp.sum(jnp.where(b.loss_mask, b.advantages * logp + 0.001 * entropy, 0.0))

    placed = lambda tree: jax.tree.map(lambda x: getattr(x, "sharding", None), tree)
    with sharding.tracing_on(mesh):
        if lora:
            train, frozen = lora_lib.split_trainable(params)
            return jax.jit(jax.grad(loss), out_shardings=placed(train) if mesh is not None else None,
                           keep_unused=True).lower(train, batch, frozen).compile()
        return jax.jit(jax.grad(loss), out_shardings=placed(params) if mesh is not None else None,
                       keep_unused=True).lower(params, batch).compile()


def candidates(mini_batch: int, row_shards: int) -> list[int]:
    """Micro-batch sizes to try, largest first: the minibatch's divisors that give every
    data×fsdp row shard the same whole number of rows (the update splits each micro-batch's
    rows over them)."""
    per_shard = mini_batch // row_shards
    return [rows * row_shards for rows in range(per_shard, 0, -1) if per_shard % rows == 0]


def largest_fitting(sizes: list[int], fits) -> int | None:
    """The first (largest) of `sizes` for which `fits` holds, None if none does, assuming a
    smaller size fits whenever a larger one does. The largest is tried first (a small model
    fits whole), then a binary search: at most 1 + ⌈log2 n⌉ calls."""
    if fits(sizes[0]):
        return sizes[0]
    low, high = 1, len(sizes)  # the answer's index is in [low, high]; high: none fits
    while low < high:
        middle = (low + high) // 2
        if fits(sizes[middle]):
            high = middle
        else:
            low = middle + 1
    return sizes[low] if low < len(sizes) else None


def device_limit(algo: AlgoConfig) -> tuple[int | None, str]:
    """(bytes auto may fill on one device, where that figure comes from); (None, why) when the
    backend reports no limit and the config sets none."""
    if algo.micro_batch_memory_gib:
        return int(algo.micro_batch_memory_gib * 2 ** 30), "algo.micro_batch_memory_gib"
    device = jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # a backend without memory statistics
        stats = None
    if not stats or "bytes_limit" not in stats:
        return None, f"the {device.platform} backend reports no memory limit"
    return int(stats["bytes_limit"]), f"the {device.device_kind}'s bytes_limit"


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def resolve(algo: AlgoConfig, policy, length: int, generated: int, mesh, state_bytes: int) -> AlgoConfig:
    """`algo` with "auto" replaced by the largest candidate micro-batch that fits (module
    docstring); a config's own number is returned as it is. `policy`: the model (abstract or
    real); `length`, `generated`: the token buffer's slots and loss slots; `state_bytes`: the
    train state per device. Prints one line from process 0; a ConfigError line when not even
    the smallest fits."""
    if algo.micro_batch_size != AUTO:
        return algo
    sizes = candidates(algo.mini_batch_size, sharding.row_shards(mesh))
    limit, source = device_limit(algo)
    if limit is None:
        chosen, note = sizes[0], f"{source}: the whole minibatch; algo.micro_batch_memory_gib sets one"
    else:
        graph, params = nnx.graphdef(policy), abstract_params(nnx.state(policy), mesh)
        lora = policy.cfg.lora.rank > 0
        measured = {}

        def fits(rows: int) -> bool:
            batch = micro_batch_inputs(rows, length, generated, mesh)
            stats = compile_gradient(graph, params, batch, mesh, lora).memory_analysis()
            measured[rows] = (int(stats.temp_size_in_bytes) + 2 * int(stats.output_size_in_bytes)
                              + sharding.device_bytes(batch))
            return measured[rows] + state_bytes <= SAFETY * limit

        chosen = distributed.smallest(largest_fitting(sizes, fits) or 0)  # every process the same program
        room = f"{gib(SAFETY * limit)}: {SAFETY:.0%} of {gib(limit)} from {source}"
        if not chosen:
            smallest = gib(measured[sizes[-1]]) if sizes[-1] in measured else "? (another process's device)"
            raise ConfigError(f"algo.micro_batch_size=auto: not even one row per data×fsdp shard fits (micro-batch "
                              f"{sizes[-1]}): forward+backward {smallest} + state {gib(state_bytes)} > {room}")
        fwd_bwd = gib(measured[chosen]) if chosen in measured else "? (the smallest over processes)"
        note = f"forward+backward {fwd_bwd} + state {gib(state_bytes)} of {room}"
    if distributed.is_lead():
        print(f"micro-batch auto: {chosen} of {algo.mini_batch_size} ({note})", file=sys.stderr)
    return dataclasses.replace(algo, micro_batch_size=chosen)

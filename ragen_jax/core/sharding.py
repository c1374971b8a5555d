"""Device mesh and placement rules (docs/architecture.md#sharding-by-mesh).

One mesh with axes (`data`, `fsdp`, `tensor`). Parameters carry partition specs over `fsdp`
and `tensor` (set where each weight is declared, `models/layers.py`); an axis that does not
divide a dimension is dropped (that dimension is replicated). Trajectory rows — env groups,
token buffers, KV caches — are split over `data` × `fsdp`. The same train step runs on one
CPU, on 8 fake CPU devices and on a TPU slice; only the mesh changes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")
FSDP, TENSOR = "fsdp", "tensor"
ROWS = ("data", FSDP)  # the mesh axes trajectory rows are split over


def make_mesh(shape: tuple[int, int, int] = (1, 1, 1), devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over the first prod(shape) devices (Auto axis types, so
    GSPMD propagates shardings from the constraints we set)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"mesh shape {shape} must be three positive sizes (data, fsdp, tensor)")
    devices = list(devices if devices is not None else jax.devices())
    need = int(np.prod(shape))
    if need > len(devices):
        raise ValueError(f"mesh {'x'.join(map(str, shape))} needs {need} devices; {len(devices)} available")
    return Mesh(np.asarray(devices[:need]).reshape(shape), AXES, axis_types=(AxisType.Auto,) * 3)


def tracing_on(mesh: Mesh | None):
    """The context to trace a program for `mesh` in (`jax.set_mesh`; nothing without a mesh):
    the model then keeps its activations' rows split over the mesh (`sharding.constrain_rows`)."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def row_shards(mesh: Mesh | None) -> int:
    """How many pieces trajectory rows are split into."""
    return 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]


def replicas_only(mesh: Mesh | None) -> bool:
    """The mesh splits only `data`: every device holds the whole model (pure data parallel)."""
    return mesh is not None and mesh.shape["data"] > 1 and mesh.shape["fsdp"] == mesh.shape["tensor"] == 1


def splits_rows(mesh: Mesh | None, *row_counts: int) -> bool:
    """Each device of `mesh` can compute its own share of every count of rows by itself: the
    mesh splits only `data` and divides them (`per_device_rows`, `rollout.rollout_on_mesh`)."""
    return replicas_only(mesh) and all(n % mesh.shape["data"] == 0 for n in row_counts)


def per_device_rows(fn, mesh: Mesh | None, shared: tuple, split: tuple, out_specs: Any = PartitionSpec(ROWS)):
    """fn(*shared, *split) with the rows (leading axis) of the `split` arrays spread over a mesh
    that splits only `data`: each device computes its own rows in a `shard_map`, with `shared`
    whole on every device and no collectives inside. GSPMD would instead run a computation that
    gathers rows by index (the cross-scoring's columns) whole on every device: on a CPU split into
    one device per core, a diagnose of 1024 rows took twice one device's time. `out_specs` places
    fn's outputs (by default rows on axis 0). Plain fn elsewhere: no mesh, a mesh that shards the
    model, or rows that do not divide."""
    if not splits_rows(mesh, *(x.shape[0] for x in jax.tree.leaves(split))):
        return fn(*shared, *split)
    in_specs = (PartitionSpec(),) * len(shared) + (PartitionSpec(ROWS),) * len(split)
    # no collectives inside, so the loop-carry varying-axis check is not needed
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*shared, *split)


def rows_indivisible(rollout_batch: int, mini_batch_size: int, shards: int) -> str | None:
    """Why the rows cannot be split evenly over `shards` devices (None when they can): the
    rollout batch and every minibatch are split over the mesh's data×fsdp axes."""
    for name, size in (("rollout batch (num_groups × group_size)", rollout_batch),
                       ("algo.mini_batch_size", mini_batch_size)):
        if size % shards:
            return f"{name}={size} must be divisible by the mesh's data×fsdp = {shards}"
    return None


def device_bytes(tree) -> int:
    """Bytes one device holds of a tree of arrays or ShapeDtypeStructs: a leaf's shard where it
    has a sharding, else the whole leaf."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        placed = getattr(leaf, "sharding", None)
        shape = placed.shard_shape(leaf.shape) if placed is not None else leaf.shape
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def put_replicated(x: jax.Array, mesh: Mesh) -> jax.Array:
    """`x` (the same value on every process) replicated over the mesh. Goes through host
    memory, so it also works when the mesh spans several processes, where a device_put of an
    array committed to one local device cannot."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = put_replicated(jax.random.key_data(x), mesh)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return jax.device_put(np.asarray(jax.device_get(x)), replicated(mesh))


def module_shardings(state: nnx.State, mesh: Mesh):
    """NamedSharding for every variable of an NNX state, from its declared partition spec."""
    specs = nnx.get_partition_spec(state)
    return jax.tree.map(lambda x, s: NamedSharding(mesh, fit_spec(x.shape, s, mesh)), state, specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def optimizer_shardings(tx, params, mesh: Mesh):
    """Shardings of `tx`'s state for `params` (arrays or ShapeDtypeStructs placed on `mesh`):
    every params-shaped part (Adam's moments) sharded like the parameters, everything else
    (step counts) replicated. Without this, `jax.jit(tx.init)` replicates the moments —
    zeros carry no sharding of their own — and FSDP would keep two full copies per device."""
    import optax

    shapes = jax.eval_shape(tx.init, params)
    return optax.tree_map_params(tx, lambda _, p: p.sharding, shapes, params,
                                 transform_non_params=lambda _: replicated(mesh))


def rows_constraint(mesh: Mesh | None):
    """A function (x, axis) -> x constrained to be split over data×fsdp along `axis` (rows),
    replicated elsewhere; identity without a mesh or when the rows do not divide evenly."""
    if mesh is None:
        return lambda x, axis=0: x
    shards = row_shards(mesh)

    def constrain(x: Any, axis: int = 0):
        def one(a):
            if a.ndim <= axis or a.shape[axis] % shards:
                return a
            spec = [None] * a.ndim
            spec[axis] = ROWS
            return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, PartitionSpec(*spec)))

        return jax.tree.map(one, x)

    return constrain


# ----------------------------------------------------------------------------- a model's parameters and activations


def traced_model_shards() -> int:
    """How many pieces the traced mesh (`jax.set_mesh`) splits the weights into (fsdp × tensor;
    1 without a mesh and inside a `shard_map`)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not {FSDP, TENSOR} <= set(mesh.axis_names):
        return 1
    if any(kind == jax.sharding.AxisType.Manual for kind in mesh.axis_types):
        return 1
    return mesh.shape[FSDP] * mesh.shape[TENSOR]


def traced_row_shards() -> int:
    """How many pieces the mesh a program is traced under (`jax.set_mesh`) splits rows into (1
    without one, and inside a `shard_map`, where each device already holds its own rows)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(ROWS) <= set(mesh.axis_names):
        return 1
    if any(kind == jax.sharding.AxisType.Manual for kind in mesh.axis_types):
        return 1
    return mesh.shape[ROWS[0]] * mesh.shape[ROWS[1]]


def constrain_rows(x: jax.Array, axis: int = 0) -> jax.Array:
    """x split over the mesh's data×fsdp axes along `axis` (its rows) when traced under a mesh
    (`jax.set_mesh`, as the train step is) whose row shards divide them; else x as it is.
    Without it GSPMD may follow the embedding's sharding (hidden dimension over fsdp) and keep
    every row of a layer's activations on every device, summing partial products instead."""
    shards = traced_row_shards()
    if shards == 1 or x.shape[axis] % shards:
        return x
    spec = [None] * x.ndim
    spec[axis] = ROWS
    return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(*spec))


def fit_spec(shape, spec, mesh: jax.sharding.Mesh) -> jax.sharding.PartitionSpec:
    """Drop mesh axes that the mesh lacks or that do not divide the dimension (replicate it)."""
    out = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        size = mesh.shape.get(axis, 0) if axis is not None else 0
        out.append(axis if size and dim % size == 0 else None)
    return jax.sharding.PartitionSpec(*out)


def param_shardings(model: nnx.Module, mesh: jax.sharding.Mesh):
    """NamedSharding for every parameter, from its partition spec fitted to the mesh."""
    state = nnx.state(model)
    specs = nnx.get_partition_spec(state)
    return jax.tree.map(lambda x, s: jax.sharding.NamedSharding(mesh, fit_spec(x.shape, s, mesh)),
                        state, specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def shard_model(model: nnx.Module, mesh: jax.sharding.Mesh) -> nnx.Module:
    """Place an existing model's parameters on a mesh (in place) and return it."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, param_shardings(model, mesh)))
    return model

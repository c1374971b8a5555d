"""Orbax checkpoints of the train state under `WORKDIR/checkpoints/<step>/state`.

The whole `TrainState` is saved (parameters, optimiser moments, critic, reference, PRNG key,
step, diagnostics EMAs), so a resumed run continues bit for bit. Writes are asynchronous and
atomic (orbax writes to a temporary directory and renames it when complete): a run killed
while saving leaves the previous checkpoint as the latest one. Evaluation and export restore
only the policy parameters (orbax partial restore), onto whatever devices are present.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from ragen_jax.models.qwen2 import stack_layers, stacked_layout, unstack_layers
from ragen_jax.train_step import TrainState


class CheckpointError(RuntimeError):
    """A missing or unreadable checkpoint (printed as one line, exit code 2)."""


def _storable(state: TrainState) -> TrainState:
    """Typed PRNG keys cannot be serialised: store their raw key data."""
    return state.replace(key=jax.random.key_data(state.key))


def _abstract(tree):
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _relayout(tree: dict, stacked: bool, stack, take) -> dict:
    """A model state dict in the stacked (or per-layer) layout, whichever it is in now."""
    if stacked_layout(tree) == stacked:
        return tree
    if stacked:
        return stack_layers(tree, stack)
    return unstack_layers(tree, jax.tree.leaves(tree["layers"])[0].shape[0], take)


def _abstract_stack(leaves):
    """The ShapeDtypeStruct of per-layer leaves stacked on a new axis 0 (replicated over it)."""
    first = leaves[0]
    sharding = first.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(None, *sharding.spec))
    return jax.ShapeDtypeStruct((len(leaves), *first.shape), first.dtype, sharding=sharding)


def _abstract_take(leaf, _):
    """The ShapeDtypeStruct of one layer's slice of a stacked leaf."""
    sharding = leaf.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:]))
    return jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype, sharding=sharding)


def _wrap_values(tree):
    """A pure state dict as orbax stores an `nnx.State`: every leaf under a "value" key."""
    return jax.tree.map(lambda x: {"value": x}, tree)


def _unwrap_values(tree):
    if isinstance(tree, dict) and set(tree) == {"value"}:
        return tree["value"]
    return {k: _unwrap_values(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _restore_args(target, partial: bool = False):
    return ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                  partial_restore=partial)


class Checkpoints:
    def __init__(self, workdir: str | os.PathLike, keep: int = 3, asynchronous: bool = True, read_only=False):
        self.directory = Path(workdir).absolute() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only, read_only=read_only,
                                               enable_async_checkpointing=asynchronous)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state",))

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, force: bool = False) -> None:
        step = int(state.step)
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(_storable(state))), force=force)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def restore(self, step: int, like: TrainState) -> TrainState:
        """The saved state, shaped and placed like `like` (a freshly initialised state)."""
        self._check(step)
        target = _abstract(_storable(like))
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(state=_restore_args(target)))
        except Exception as err:  # corrupt or incompatible files: one line, not a traceback
            raise CheckpointError(f"checkpoint {self.directory / str(step)} could not be restored: "
                                  f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None
        return restored.state.replace(key=jax.random.wrap_key_data(restored.state.key))

    def restore_policy(self, step: int, policy_like: nnx.State) -> nnx.State:
        """Only the policy parameters (evaluation, export, initial weights), placed like
        `policy_like`. A policy saved with its layers stacked (a scanned model) restores into a
        per-layer model and the other way round."""
        self._check(step)
        like = _abstract(policy_like)
        saved_stacked = self._policy_stacked(step)
        want_stacked = stacked_layout(nnx.to_pure_dict(like))
        if saved_stacked is None or saved_stacked == want_stacked:
            target = like
        else:  # restore in the saved layout, then convert
            target = _wrap_values(_relayout(nnx.to_pure_dict(like), saved_stacked, _abstract_stack, _abstract_take))
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=_restore_args({"policy": target}, partial=True)))
        except Exception as err:
            raise CheckpointError(f"checkpoint {self.directory / str(step)} could not be restored: "
                                  f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None
        policy = restored.state["policy"]
        if target is not like:
            values = _relayout(_unwrap_values(policy), want_stacked, jax.numpy.stack, lambda x, i: x[i])
            policy = nnx.State(policy_like)
            nnx.replace_by_pure_dict(policy, jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), values,
                                                          nnx.to_pure_dict(like)))
        return policy if isinstance(policy, nnx.State) else nnx.State(policy)

    def _policy_stacked(self, step: int) -> bool | None:
        """Whether step's saved policy holds stacked layers (None: its metadata is unreadable)."""
        try:
            reader = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(read_only=True),
                                           item_names=("state",),
                                           item_handlers={"state": ocp.PyTreeCheckpointHandler()})
            try:
                return stacked_layout(reader.item_metadata(step)["state"]["policy"])
            finally:
                reader.close()
        except Exception:  # no metadata: restore as asked, and let the restore name the problem
            return None

    def _check(self, step: int) -> None:
        steps = self.steps()
        if step not in steps:
            have = ", ".join(map(str, steps)) if steps else "none"
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (available: {have})")

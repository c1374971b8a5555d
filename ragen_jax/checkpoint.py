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

from ragen_jax.train_step import TrainState


class CheckpointError(RuntimeError):
    """A missing or unreadable checkpoint (printed as one line, exit code 2)."""


def _storable(state: TrainState) -> TrainState:
    """Typed PRNG keys cannot be serialised: store their raw key data."""
    return state.replace(key=jax.random.key_data(state.key))


def _abstract(tree):
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


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
        """Only the policy parameters (evaluation, export), placed like `policy_like`."""
        self._check(step)
        target = {"policy": _abstract(policy_like)}
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=_restore_args(target, partial=True)))
        except Exception as err:
            raise CheckpointError(f"checkpoint {self.directory / str(step)} could not be restored: "
                                  f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None
        policy = restored.state["policy"]
        return policy if isinstance(policy, nnx.State) else nnx.State(policy)

    def _check(self, step: int) -> None:
        steps = self.steps()
        if step not in steps:
            have = ", ".join(map(str, steps)) if steps else "none"
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (available: {have})")

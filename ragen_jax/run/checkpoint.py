"""Orbax checkpoints of the train state under `WORKDIR/checkpoints/<step>/state`.

The whole `TrainState` is saved (parameters, optimiser moments, critic, reference, PRNG key,
step, diagnostics EMAs), so a resumed run continues bit for bit — except a LoRA run's frozen
base weights: its checkpoints hold what trains (the adapters, a critic's value head, their
moments), and `base.json` beside them names the base (the config's model keys) with a
fingerprint of its weights; restoring joins the saved part with the base the run loaded, after
checking the fingerprint (another base is a one-line error). Writes are asynchronous and
atomic (orbax writes to a temporary directory and renames it when complete): a run killed
while saving leaves the previous checkpoint as the latest one. Evaluation and export restore
only the policy parameters (orbax partial restore), onto whatever devices are present.

Faults. Once a save has finished, its step directory gets a list of its files
(`files.json`: each file's size, and a CRC-32 for files up to 256 MiB), and a restore first
checks the files against it: a truncated, zeroed, deleted or garbled file is named in one
line before orbax reads anything (orbax does not notice bytes changed in place in a data file
and restores wrong numbers; a read that fails inside orbax may leave its other reads running
in closed event loops). `restore_newest` falls back to older
checkpoints; `set_aside` moves a damaged one out of orbax's directory. A save first checks
that the disk has room for the state; a write that fails anyway, in orbax's background
thread, is raised as `CheckpointWriteError` at the next `poll`, `save` or `close`, and its
partial files are removed. A failed read or write leaves orbax's other transfers of it to finish
later, raising into closed coroutines or reporting to an event loop already closed: those
unraisable exceptions are not printed; the failure itself is, once, by us.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import zlib
from pathlib import Path
from typing import Callable, TypeVar

import jax
import orbax.checkpoint as ocp
from flax import nnx

from ragen_jax.models import lora
from ragen_jax.models.stacking import stack_layers, stacked_layout, unstack_layers
from ragen_jax.core import distributed
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import describe, write_atomically
from ragen_jax.training.step import TrainState

FILE_LIST = "files.json"
BASE = "base.json"
CRC_LIMIT = 256 << 20  # larger files (2 GB OCDBT data files of big models) are checked by size only
ROOM_MARGIN = 1 << 20  # metadata files beside the arrays
T = TypeVar("T")


class _ReportedByUs(logging.Filter):
    """Orbax logs a failed write or read with its traceback, then raises it to us, and
    `Checkpoints` turns each into a one-line error: its ERROR records are not printed again."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not record.pathname.startswith(_ORBAX)


_ORBAX = str(Path(ocp.__file__).parent)
logging.getLogger("absl").addFilter(_ReportedByUs())  # orbax logs through absl's logger


def _orbax_leftover(unraisable) -> bool:
    """What a failed orbax read or write leaves behind (see the module's docstring): one of its
    coroutines closed after it failed, or a callback reporting to a loop already closed
    (`call_soon_threadsafe` on a closed loop), raised where no one can catch it."""
    code = getattr(unraisable.object, "cr_code", None)
    if code is not None and code.co_filename.startswith(_ORBAX):
        return True
    frame = unraisable.exc_traceback
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"
            and frame is not None and frame.tb_frame.f_code.co_filename == asyncio.base_events.__file__)


def _quiet_orbax_leftovers() -> None:
    """Drop `_orbax_leftover`s, pass every other unraisable exception on (installed once)."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_orbax_leftovers", False):
        return

    def hook(unraisable):
        if not _orbax_leftover(unraisable):
            previous(unraisable)

    hook.drops_orbax_leftovers = True
    sys.unraisablehook = hook


class CheckpointError(RuntimeError):
    """A missing, damaged or unreadable checkpoint (printed as one line, exit code 2)."""


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written, e.g. on a full disk (one line, exit code 1)."""


def _storable(state: TrainState) -> TrainState:
    """What a checkpoint holds of `state`: a LoRA run's trained part (`_saved_part`), typed PRNG
    keys as their raw key data (they cannot be serialised)."""
    return _saved_part(state).replace(key=jax.random.key_data(state.key))


def _adapted(policy: nnx.State) -> bool:
    return bool(jax.tree.leaves(nnx.filter_state(policy, lora.LoRAParam)))


def _saved_part(state: TrainState) -> TrainState:
    """`state` without a LoRA run's frozen base weights (policy and critic: what trains)."""
    if not _adapted(state.policy):
        return state
    return state.replace(policy=lora.trainable(state.policy),
                         critic=None if state.critic is None else lora.trainable(state.critic))


def _with_base(saved: nnx.State, like: nnx.State) -> nnx.State:
    """A restored trained part joined with `like`'s frozen base weights."""
    return lora.join(saved, lora.split_trainable(like)[1])


def base_fingerprint(policy: nnx.State) -> list[float]:
    """One number per frozen base weight of a LoRA policy (the mean of its absolute values, in
    float32): equal for the same base loaded again, far apart for another one."""
    frozen = lora.split_trainable(policy)[1]
    means = [jax.numpy.mean(jax.numpy.abs(x.astype(jax.numpy.float32))) for x in jax.tree.leaves(frozen)]
    return [float(m) for m in jax.device_get(means)]


def _same_base(saved: list[float], loaded: list[float]) -> bool:
    return len(saved) == len(loaded) and all(abs(a - b) <= 1e-3 * abs(a) + 1e-12 for a, b in zip(saved, loaded))


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


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def list_files(directory: Path) -> dict:
    """{relative path: {"size": bytes, "crc32": checksum}} of every file under `directory`."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != FILE_LIST:
            size = path.stat().st_size
            files[str(path.relative_to(directory))] = {"size": size, **(
                {"crc32": _crc32(path)} if size <= CRC_LIMIT else {})}
    return files


class _CheckpointFiles:
    """The step directories of one workdir's checkpoints: which steps exist, their file lists
    checked (`verify`), the newest that restores (`restore_newest`), a damaged one moved aside.
    `Checkpoints` adds saving and restoring; `self.directory` and `self.manager` are its."""

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def _check(self, step: int) -> None:
        steps = self.steps()
        if step not in steps:
            have = ", ".join(map(str, steps)) if steps else "none"
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (available: {have})")

    def verify(self, step: int) -> None:
        """Raise CheckpointError naming the first file of `step` that differs from its file list.
        A checkpoint without a list (a run killed before writing it) is left to orbax's checks."""
        directory = self.directory / str(step)
        if not (directory / FILE_LIST).exists():
            return
        try:
            expected = json.loads((directory / FILE_LIST).read_text())["files"]
            expected = {name: (int(want["size"]), want.get("crc32")) for name, want in expected.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"checkpoint {directory} is damaged: its {FILE_LIST} is unreadable") from None
        for name, (size, crc) in expected.items():
            path = directory / name
            if not path.is_file():
                problem = "is missing"
            elif path.stat().st_size != size:
                problem = f"has {path.stat().st_size} bytes instead of {size}"
            elif crc is not None and _crc32(path) != crc:
                problem = "does not match its checksum"
            else:
                continue
            raise CheckpointError(f"checkpoint {directory} is damaged: {name} {problem}")

    def restore_newest(self, restore: Callable[[int], T]) -> tuple[int, T, list[tuple[int, CheckpointError]]]:
        """`restore(step)` of the newest checkpoint it succeeds on: (step, result, the newer
        steps that failed with their errors). When none restores, the newest's error is raised
        and nothing is called damaged: then the code or the config, not the files, is at fault."""
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        failed = []
        for step in reversed(steps):
            try:
                result, error = restore(step), None
            except CheckpointError as err:
                result, error = None, err
            if distributed.any_process(error is not None):  # every process restores the same step
                failed.append((step, error or CheckpointError(
                    f"checkpoint {self.directory / str(step)} could not be restored on another process")))
                continue
            return step, result, failed
        raise failed[0][1]

    def set_aside(self, step: int) -> Path:
        """Move a damaged checkpoint to WORKDIR/damaged_checkpoints/<step> (kept for the user to
        inspect or delete, out of orbax's sight so the step can be saved again); returns where."""
        aside = self.directory.parent / "damaged_checkpoints"
        target, copy = aside / str(step), 1
        while target.exists():
            copy += 1
            target = aside / f"{step}-{copy}"
        if distributed.is_lead():
            aside.mkdir(exist_ok=True)
            (self.directory / str(step)).rename(target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"ragen_jax set aside checkpoint {step}")
        self.manager.reload()
        return target


class _Saving(_CheckpointFiles):
    """Writing checkpoints: in the background, after a check for room, each failure raised as
    one `CheckpointWriteError` and its partial files removed."""

    def save(self, state: TrainState, force: bool = False) -> None:
        """Start writing `state` (in the background); the previous save is finished first."""
        self.settle()
        step = int(state.step)
        if _adapted(state.policy) and self._fingerprint is None:
            self._fingerprint = base_fingerprint(state.policy)
        stored = _storable(state)
        needed, free = self._room_needed(stored), shutil.disk_usage(self.directory).free
        if distributed.any_process(free < needed):  # orbax failing mid-write leaves work in its event loops
            raise CheckpointWriteError(f"checkpoint {self.directory / str(step)} not written: its disk has "
                                       f"{free / 2**20:.1f} MiB free, a checkpoint needs about "
                                       f"{needed / 2**20:.1f} MiB")
        try:
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(stored)), force=force)
        except Exception as err:
            self._discard(step)
            raise CheckpointWriteError(f"checkpoint {self.directory / str(step)} could not be written: "
                                       f"{describe(err)}") from None
        self.pending = step

    def _room_needed(self, stored) -> int:
        """Bytes a save may take: the newest checkpoint's size on disk and a quarter more (the
        optimiser's moments fill in as training goes), at most the state's uncompressed size
        (the first save of a run), plus room for orbax's metadata."""
        size = sum(x.nbytes for x in jax.tree.leaves(stored))
        if steps := self.steps():
            on_disk = sum(p.stat().st_size for p in (self.directory / str(steps[-1])).rglob("*") if p.is_file())
            size = min(size, int(1.25 * on_disk))
        return size + ROOM_MARGIN

    def poll(self) -> None:
        """Raise a background write's failure if it has happened; never waits."""
        if self.pending is not None and not self.manager.is_saving_in_progress():
            self.settle()

    def settle(self) -> None:
        """Wait for the last save; raise its failure (CheckpointWriteError) or list its files."""
        if self.pending is None:
            return
        step, self.pending = self.pending, None
        try:
            self.manager.wait_until_finished()
        except Exception as err:
            self._discard(step)
            raise CheckpointWriteError(f"checkpoint {self.directory / str(step)} could not be written: "
                                       f"{describe(err)}") from None
        directory = self.directory / str(step)
        if not directory.is_dir():  # orbax logs some failures without raising them
            raise CheckpointWriteError(f"checkpoint {directory} could not be written (orbax did not finish it)")
        if distributed.is_lead():
            if self._fingerprint is not None:  # before the file list, which then covers it
                write_atomically(directory / BASE, json.dumps({"model": self.base, "fingerprint": self._fingerprint}))
            write_atomically(directory / FILE_LIST, json.dumps({"files": list_files(directory)}, indent=1))

    def close(self) -> None:
        """Finish the last save, then stop orbax's threads, also when the save failed (threads
        left running at exit print tracebacks)."""
        try:
            self.settle()
        finally:
            self.manager.close()

    def _discard(self, step: int) -> None:
        """Remove what a failed save of `step` left in orbax's temporary directories."""
        if distributed.is_lead():
            for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)


class _Restoring(_CheckpointFiles):
    """Reading checkpoints: the whole state, or only the policy into either layer layout; a
    LoRA checkpoint only onto the base it names."""

    def restore(self, step: int, like: TrainState) -> TrainState:
        """The saved state, shaped and placed like `like` (a freshly initialised state; a LoRA
        run's base weights are `like`'s)."""
        self._check(step)
        self.verify(step)
        self._check_base(step, like.policy)
        target = _abstract(_storable(like))
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(state=_restore_args(target)))
        except Exception as err:  # corrupt or incompatible files: one line, not a traceback
            raise CheckpointError(f"checkpoint {self.directory / str(step)} could not be restored: "
                                  f"{describe(err)}") from None
        state = restored.state.replace(key=jax.random.wrap_key_data(restored.state.key))
        if _adapted(like.policy):
            state = state.replace(policy=_with_base(state.policy, like.policy),
                                  critic=None if like.critic is None else _with_base(state.critic, like.critic))
        return state

    def _check_base(self, step: int, policy_like: nnx.State) -> None:
        """A LoRA checkpoint's adapters belong to the base it names: a ConfigError (not damage:
        every checkpoint of the run would fail the same way) when the loaded base differs."""
        if not _adapted(policy_like):
            return
        path = self.directory / str(step) / BASE
        if not path.exists():  # a run killed before it finished the save: orbax's files are complete
            return
        try:
            saved = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(f"checkpoint {self.directory / str(step)}: {BASE} is unreadable ({describe(err)}); "
                                  "a LoRA checkpoint names its base there") from None
        if self._fingerprint is None:
            self._fingerprint = base_fingerprint(policy_like)
        if not _same_base(saved["fingerprint"], self._fingerprint):
            names = ", ".join(f"{k}={v!r}" for k, v in (saved.get("model") or {}).items() if v) or "unnamed"
            raise ConfigError(f"checkpoint {self.directory / str(step)} holds LoRA adapters of another base "
                              f"({names}): the base weights loaded now differ from the ones it was trained on")

    def restore_policy(self, step: int, policy_like: nnx.State) -> nnx.State:
        """Only the policy parameters (evaluation, export, initial weights), placed like
        `policy_like`. A policy saved with its layers stacked (a scanned model) restores into a
        per-layer model and the other way round."""
        self._check(step)
        self.verify(step)
        self._check_base(step, policy_like)
        adapted = _adapted(policy_like)
        full_like, policy_like = policy_like, lora.trainable(policy_like) if adapted else policy_like
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
                                  f"{describe(err)}") from None
        policy = restored.state["policy"]
        if target is not like:
            values = _relayout(_unwrap_values(policy), want_stacked, jax.numpy.stack, lambda x, i: x[i])
            policy = nnx.State(policy_like)
            nnx.replace_by_pure_dict(policy, jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), values,
                                                          nnx.to_pure_dict(like)))
        policy = policy if isinstance(policy, nnx.State) else nnx.State(policy)
        return _with_base(policy, full_like) if adapted else policy

    def _policy_stacked(self, step: int) -> bool | None:
        """Whether step's saved policy holds stacked layers (None: its metadata is unreadable)."""
        try:
            # create=False and no save: as read-only as orbax's read_only option, without its warnings
            reader = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(create=False),
                                           item_names=("state",),
                                           item_handlers={"state": ocp.PyTreeCheckpointHandler()})
            try:
                return stacked_layout(reader.item_metadata(step)["state"]["policy"])
            finally:
                reader.close()
        except Exception:  # no metadata: restore as asked, and let the restore name the problem
            return None


class Checkpoints(_Saving, _Restoring):
    """The checkpoints of one workdir: saving (`_Saving`), restoring (`_Restoring`), the step
    directories and their checks (`_CheckpointFiles`). `read_only`: for evaluation, export and
    initial weights, which never save (and must work on a workdir they may not write)."""

    def __init__(self, workdir: str | os.PathLike, keep: int = 3, asynchronous: bool = True, read_only=False,
                 base: dict | None = None):
        """`base`: what names a LoRA run's base (the config's model keys), written to `base.json`."""
        self.directory = Path(workdir).absolute() / "checkpoints"
        self.base = base
        _quiet_orbax_leftovers()
        self._fingerprint: list[float] | None = None  # of the base the run loaded (computed once)
        if read_only:  # create=False and no save ever: orbax's read_only option only adds warnings
            options = ocp.CheckpointManagerOptions(create=False)
        else:  # a writer removes the temporary directories of saves a crash interrupted
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=True,
                                                   enable_async_checkpointing=asynchronous)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state",))
        self.pending: int | None = None  # the step of a save that may still be writing

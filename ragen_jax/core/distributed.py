"""Several processes, one mesh: `jax.distributed` set-up for the commands.

Every process runs the same program over the same global mesh (multi-controller JAX): the
compiled train step sees global arrays, each process's devices hold their rows of the batch
(its share of env groups: rows are split over the mesh's data×fsdp axes and the devices are
ordered by process) and their shards of the weights. Metrics are reductions over the global
batch computed inside the step, so every process reads the same values from its local
replica; only process 0 writes logs. Orbax saves and restores checkpoints collectively.

`initialize` is called once, before anything touches a device:

- explicit: `--coordinator HOST:PORT --num-processes N --process-id I` (all three), e.g. two
  processes on one machine over the loopback;
- otherwise JAX's own detection (Cloud TPU pod slices, SLURM, Open MPI, Kubernetes, or the
  `JAX_COORDINATOR_ADDRESS` environment variable); with no cluster found it is one process.

Cross-process collectives on CPU use gloo (`jax_cpu_collectives_implementation`); TPU and GPU
use their own interconnects.
"""

from __future__ import annotations

import numpy as np

from ragen_jax.core.errors import ConfigError


def add_arguments(parser) -> None:
    group = parser.add_argument_group("multi-process (jax.distributed; auto-detected on TPU pods and SLURM)")
    group.add_argument("--coordinator", default=None, help="HOST:PORT of process 0's coordinator service")
    group.add_argument("--num-processes", type=int, default=None, help="how many processes take part")
    group.add_argument("--process-id", type=int, default=None, help="this process's index, 0 … num-processes − 1")


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> int:
    """Join the process group (explicit arguments, or auto-detection); returns the number of
    processes. Must run before any computation."""
    import jax

    given = [v is not None for v in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        raise ConfigError("--coordinator, --num-processes and --process-id go together (got "
                          f"coordinator={coordinator!r}, num_processes={num_processes}, process_id={process_id})")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ConfigError(f"--process-id={process_id} must be in [0, --num-processes={num_processes})")
        if num_processes > 1:
            jax.distributed.initialize(coordinator, num_processes, process_id)
        return jax.process_count()
    try:
        jax.distributed.initialize()  # JAX's cluster detection
    except RuntimeError:
        pass  # already initialised, or devices already in use in this process (in-process calls): keep them
    except ValueError as err:
        if "coordinator_address should be defined" not in str(err):
            raise ConfigError(f"jax.distributed.initialize() failed: {str(err).splitlines()[0]}") from None
        # no cluster detected: one process
    return jax.process_count()


def is_lead() -> bool:
    """Process 0: the one that writes logs, configs and plots."""
    import jax

    return jax.process_index() == 0


def any_process(flag: bool) -> bool:
    """True when `flag` is true on any process (a collective: every process must call it)."""
    import jax

    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(bool(flag)))).any())


def smallest(value: int) -> int:
    """The smallest of every process's `value` (a collective: every process must call it), so
    that choices made from each process's own device agree."""
    import jax

    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    return int(np.asarray(multihost_utils.process_allgather(np.int32(value))).min())


def to_host(tree):
    """NumPy copies of a pytree of arrays under any process count: fully addressable or
    replicated arrays are read locally; arrays sharded across processes are gathered from
    every process (a collective: every process must call it)."""
    import jax

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            return np.asarray(jax.device_get(x))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)

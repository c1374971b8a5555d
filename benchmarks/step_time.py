"""Seconds per train step of a config, and of its rollout alone: where a step's time goes.

    python benchmarks/step_time.py --config configs/sokoban_tiny.py [--steps 8] [--set algo.micro_batch_size=8 ...]

One process, one setting, on the devices `python -m ragen_jax.train` would use (on a CPU one jax
device per core; `XLA_FLAGS=--xla_force_host_platform_device_count=1` keeps one): the rollout
alone (jitted, best and median of 3 calls after a warm-up), then the whole train step, printed
step by step after a warm-up step (step 1 also compiles and runs the diagnostics) with the rows
the filter kept and the forward/backward passes the update ran. Compare settings in separate
runs on a quiet machine; the same seed gives the same rollouts and kept rows in each.
"""

from __future__ import annotations

import statistics
import sys
import time

from ragen_jax.analysis import run_configs


def main(argv=None) -> int:
    parser = run_configs.config_command(__doc__.split("\n\n")[0], steps=8)
    args = parser.parse_args(argv)
    config = run_configs.command_config(parser, args)
    from ragen_jax.core import host_devices

    if count := host_devices.split_host(config):  # before jax starts, as `train` does
        print(host_devices.note(count), file=sys.stderr)

    import jax

    from ragen_jax.run.experiment import make_experiment

    try:
        exp = make_experiment(config, training=True)
        trainer = exp.trainer()
    except ValueError as err:
        parser.error(str(err).splitlines()[0])
    state = trainer.init_state(jax.random.key(config.seed), exp.model)

    rollout_only = trainer.play_rollout  # compiled, as the step plays it (per device on a data-only mesh)

    jax.block_until_ready(rollout_only(state.policy, jax.random.key(1), exp.codec, exp.prompt))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(rollout_only(state.policy, jax.random.key(1), exp.codec, exp.prompt))
        times.append(time.perf_counter() - start)
    print(f"rollout alone: best {min(times):.2f} s, median {statistics.median(times):.2f} s")

    state, metrics = trainer.step(state)  # compile + step 1 (diagnostics run at step 1)
    jax.block_until_ready(metrics)
    for _ in range(args.steps):
        start = time.perf_counter()
        state, metrics = trainer.step(state)
        jax.block_until_ready(metrics)
        print(f"step {int(state.step):3d}: {time.perf_counter() - start:5.2f} s  kept rows "
              f"{float(metrics['update/kept_rows']):4.0f}  minibatches {float(metrics['update/minibatches']):.0f}  "
              f"forward/backward passes {float(metrics['update/micro_batches']):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Layers unrolled or scanned (`model.scan_layers`) on this machine: compile seconds and seconds
per train step of a config, both layouts in one process, and their ratio.

    python benchmarks/scan_layers.py [--config configs/sokoban_tiny.py] [--steps 4] [--set KEY=VALUE ...]

Each layout compiles the whole train step ahead of time, runs the first step (it also runs the
diagnostics), then `--steps` more, timed one by one (the median is printed). The same seed
gives the same rollouts in both, up to float rounding. On a CPU run it on a quiet machine and
compare the ratio, not the seconds across runs.
"""

from __future__ import annotations

import statistics
import sys
import time

from ragen_jax.analysis import run_configs


def measure(config, steps: int) -> dict:
    import jax

    from ragen_jax.core import sharding
    from ragen_jax.run.experiment import make_experiment

    exp = make_experiment(config, training=True)
    trainer = exp.trainer()
    state = trainer.init_state(jax.random.key(config.seed), exp.model)
    with sharding.tracing_on(exp.mesh):
        started = time.perf_counter()
        compiled = jax.jit(trainer.step_fn, donate_argnums=0).lower(state, exp.codec, exp.prompt).compile()
        compile_s = time.perf_counter() - started
        times = []
        for _ in range(steps + 1):
            started = time.perf_counter()
            state, metrics = compiled(state, exp.codec, exp.prompt)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - started)
    return {"compile": compile_s, "first": times[0], "step": statistics.median(times[1:]),
            "success": float(metrics["rollout/success"])}


def main(argv=None) -> int:
    parser = run_configs.config_command(__doc__.split("\n\n")[0], steps=4)
    args = parser.parse_args(argv)
    results = {}
    for layout, scan in (("unrolled", "false"), ("scanned", "true")):
        config = run_configs.command_config(parser, args, {"model.scan_layers": scan})
        try:
            results[layout] = measure(config, args.steps)
        except ValueError as err:
            parser.error(str(err).splitlines()[0])
    print(f"{'layers':10s} {'compile s':>10s} {'first step s':>13s} {'step s':>8s}")
    for layout, r in results.items():
        print(f"{layout:10s} {r['compile']:10.1f} {r['first']:13.2f} {r['step']:8.3f}")
    u, s = results["unrolled"], results["scanned"]
    print(f"scanned / unrolled: compile {s['compile'] / u['compile']:.2f}x, step {s['step'] / u['step']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

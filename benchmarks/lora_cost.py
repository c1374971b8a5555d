"""LoRA against full fine-tuning on one config, in one run: the train step's seconds and memory.

    python benchmarks/lora_cost.py --config configs/sokoban_smollm2.py [--rank 16] [--steps 3] [--set KEY=VALUE ...]

Each setting runs in a process of its own on one jax device: it compiles the whole train step
ahead of time (XLA's memory analysis of it: arguments, temporaries, peak), runs the first step
(which also runs the diagnostics) and then `--steps` steps, timed one by one, and reports the
process's peak resident memory. Prints one row per setting and LoRA's ratio to full
fine-tuning. Compare on a quiet machine: both settings play the same first rollout (same seed),
later steps keep different rows as the two policies drift apart (the kept rows are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from ragen_jax.analysis import run_configs

GIB = 1024 ** 3


def measure(config, steps: int) -> dict:
    """One setting in this process: compile the step, run it, and return its figures."""
    import resource

    import jax
    from ragen_jax.run.experiment import make_experiment

    exp = make_experiment(config, training=True)
    trainer = exp.trainer()
    state = trainer.init_state(jax.random.key(config.seed), exp.model)
    trained = trainer.setup.learner.opt_params(state.policy)
    started = time.perf_counter()
    step = jax.jit(trainer.step_fn, donate_argnums=0).lower(state, exp.codec, exp.prompt).compile()
    compile_s = time.perf_counter() - started
    stats = step.memory_analysis()
    sizes = {name: int(getattr(stats, f"{name}_size_in_bytes")) for name in ("argument", "output", "alias", "temp")}
    state, metrics = step(state, exp.codec, exp.prompt)  # step 1: the diagnostics run too
    jax.block_until_ready(metrics)
    times, kept = [], []
    for _ in range(steps):
        started = time.perf_counter()
        state, metrics = step(state, exp.codec, exp.prompt)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - started)
        kept.append(int(metrics["update/kept_rows"]))
    return {
        "trained_parameters": int(sum(x.size for x in jax.tree.leaves(trained))),
        "optimizer_bytes": int(sum(x.nbytes for x in jax.tree.leaves(state.policy_opt))),
        "compile_s": compile_s, "step_s": times, "kept_rows": kept,
        "peak_bytes": sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"],
        "temp_bytes": sizes["temp"],
        "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def row(name: str, m: dict) -> str:
    step = statistics.median(m["step_s"])
    return (f"{name:<22} trained {m['trained_parameters'] / 1e6:8.2f}M  optimiser {m['optimizer_bytes'] / GIB:6.3f} GiB  "
            f"compiled peak {m['peak_bytes'] / GIB:6.2f} GiB (temporaries {m['temp_bytes'] / GIB:5.2f})  "
            f"peak RSS {m['rss_bytes'] / GIB:5.2f} GiB  compile {m['compile_s']:5.1f} s  "
            f"step median {step:6.2f} s (kept rows {m['kept_rows']})")


def main(argv=None) -> int:
    parser = run_configs.config_command(__doc__.split("\n\n")[0], steps=3)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha stays the config's)")
    parser.add_argument("--one", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank < 1:
        parser.error(f"--rank={args.rank} must be >= 1")
    if args.one:  # a child: one setting, its figures as JSON on the last line
        extra = {"model.lora.rank": str(args.rank)} if args.one == "lora" else {}
        print(json.dumps(measure(run_configs.command_config(parser, args, extra), args.steps)))
        return 0
    run_configs.command_config(parser, args)  # a bad --config or --set ends here, before any child
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    results = {}
    for name in ("full", "lora"):
        command = [sys.executable, __file__, "--one", name, "--config", args.config, "--steps", str(args.steps),
                   "--rank", str(args.rank)] + [f"--set={s}" for s in args.set]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr)
            return done.returncode
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    full, adapted = results["full"], results["lora"]
    print(row("full fine-tuning", full))
    print(row(f"LoRA rank {args.rank}", adapted))
    ratio = lambda key: adapted[key] / full[key]
    print(f"LoRA / full: step time {statistics.median(adapted['step_s']) / statistics.median(full['step_s']):.2f}x, "
          f"compiled peak {ratio('peak_bytes'):.2f}x, temporaries {ratio('temp_bytes'):.2f}x, "
          f"peak RSS {ratio('rss_bytes'):.2f}x, optimiser {ratio('optimizer_bytes'):.4f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The MI diagnostics scored at the full generation width against only the spans they read
(`diagnostics.span_buckets`), on one rollout of a config, in one run:

    python benchmarks/diagnostics_spans.py --config configs/sokoban_tiny.py [--buckets 4] [--steps 5]

Plays one rollout with the config's initial model (the step's compiled rollout), then runs
`diagnose` on it with `span_buckets=1` (today's default: every sample scored over the whole
generation width) and with `--buckets`, each compiled first, then timed alternately `--steps`
times. Prints the best seconds of each, their ratio, how wide the scored spans were, and the
largest metric difference (float rounding only).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from ragen_jax.analysis import run_configs


def main(argv=None) -> int:
    parser = run_configs.config_command(__doc__.split("\n\n")[0], steps=5)
    parser.add_argument("--buckets", type=int, default=4, help="diagnostics.span_buckets to compare (default 4)")
    args = parser.parse_args(argv)
    if args.buckets < 2:
        parser.error(f"--buckets={args.buckets} must be >= 2 (1 is the full width it is compared with)")
    config = run_configs.command_config(parser, args)

    import jax
    import numpy as np

    from ragen_jax.diagnostics.buffer_scoring import span_widths
    from ragen_jax.diagnostics.diagnose import DiagnosticsState, diagnose
    from ragen_jax.models.stacking import for_inference
    from ragen_jax.run.experiment import make_experiment

    try:
        exp = make_experiment(config, training=True)
        trainer = exp.trainer()
    except ValueError as err:
        parser.error(str(err).splitlines()[0])
    diag = trainer.config.diagnostics
    if diag is None:
        parser.error("the config's diagnostics are off (diagnostics.enabled=false): nothing to compare")
    state = trainer.init_state(jax.random.key(config.seed), exp.model)
    traj = jax.block_until_ready(trainer.play_rollout(state.policy, jax.random.key(1), exp.codec, exp.prompt))
    policy = for_inference(exp.model)
    group_size = trainer.config.rollout.group_size
    run = jax.jit(diagnose, static_argnames=("config", "group_size", "mesh"))
    settings = {"full width": dataclasses.replace(diag, span_buckets=1),
                f"span_buckets={args.buckets}": dataclasses.replace(diag, span_buckets=args.buckets)}
    call = lambda cfg: run(policy, traj, jax.random.key(2), cfg, DiagnosticsState.create(), group_size=group_size,
                           mesh=exp.mesh)
    metrics, compile_s = {}, {}
    for name, cfg in settings.items():
        start = time.perf_counter()
        metrics[name] = jax.device_get(jax.block_until_ready(call(cfg))[0])
        compile_s[name] = time.perf_counter() - start
    best = dict.fromkeys(settings, float("inf"))
    for _ in range(args.steps):
        for name, cfg in settings.items():
            start = time.perf_counter()
            jax.block_until_ready(call(cfg))
            best[name] = min(best[name], time.perf_counter() - start)

    width = traj.layout.generation
    played = np.asarray(traj.turn_active)
    used = np.asarray(traj.gen_lengths)[played]
    full, narrow = settings
    diff = max(abs(float(metrics[full][k]) - float(metrics[narrow][k])) for k in metrics[full])
    print(f"generation width {width}; generated lengths of the played turns: median {np.median(used):.0f}, "
          f"max {used.max()}; widths {span_widths(width, args.buckets)}")
    print(f"| setting | first call (compile + run) s | best of {args.steps} s |\n| --- | ---: | ---: |")
    for name in settings:
        print(f"| {name} | {compile_s[name]:.1f} | {best[name]:.3f} |")
    print(f"ratio (full width / spans): {best[full] / best[narrow]:.2f}x; largest metric difference {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

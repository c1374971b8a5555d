"""Supervised fit speed: minibatches with their holes squeezed out (`batch.compact`) vs the raw
rollout buffer, on the same demonstrations, same steps.

    python benchmarks/sft_fit_speed.py [--env frozenlake] [--episodes 256] [--set rollout.max_turns=3]

The rollout buffer reserves `max_new_tokens` slots per turn and slots for every turn an episode
may not reach; the supervised fit only needs the valid ones. Prints seconds per optimiser step
(steady, compile excluded), the rows' mean width and the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from ragen_jax.analysis import run_configs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=("sokoban", "frozenlake"), default="frozenlake")
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    overrides = run_configs.set_overrides(args.set, parser.error)

    import jax
    import numpy as np

    from ragen_jax.models.config import DecoderConfig
    from ragen_jax.models.decoder import init_model
    from ragen_jax.rl.batch import batch_from_trajectories, compact
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training import sft

    config = run_configs.run_config(args.env, 0, {"model.init": "None", **overrides})
    exp = make_experiment(config)
    rollout_config = dataclasses.replace(exp.run.step.rollout, num_groups=args.episodes, group_size=1)
    data = sft.demonstrations(jax.random.key(0), exp.env, sft.deterministic(exp.env, exp.env_params), exp.codec,
                              exp.prompt, exp.tokenizer, rollout_config)
    batch = batch_from_trajectories(data)
    widths = [compact(jax.tree.map(lambda a: a[i:i + 32], batch)).tokens.shape[1]
              for i in range(0, args.episodes, 32)]
    print(f"{args.env}, {rollout_config.max_turns} turns: buffer {batch.tokens.shape[1]} slots, "
          f"compacted minibatches {np.mean(widths):.0f} on average (valid per row {np.asarray(batch.mask).sum(1).mean():.0f})")
    seconds = {}
    for name, squeeze in (("raw buffer", False), ("compacted", True)):
        def run(epochs):
            model = init_model(DecoderConfig.preset("tiny"), jax.random.key(0))
            started = time.perf_counter()
            sft.fit(model, data, sft.SFTConfig(epochs=epochs, compact=squeeze), log=lambda _: None)
            return time.perf_counter() - started
        first, steady = run(1), run(2)  # fit compiles afresh each call: the extra epoch is the steady part
        seconds[name] = (steady - first) / (args.episodes // 32)
        print(f"  {name:10s} {seconds[name]:.3f} s per step")
    print(f"  compacted is {seconds['raw buffer'] / seconds['compacted']:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())

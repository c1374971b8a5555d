"""Does the diagnostics' MI see a start that reads the board? Several policies on the same prompts.

    python benchmarks/grounding_mi.py --config configs/sokoban_smollm2.py \
        --workdirs runs/smollm2_grounded runs/smollm2_sft --names grounded format --batches 4

Every workdir's policy (its newest checkpoint) is loaded into one experiment of `--config`, so
all of them play the same levels with the same keys: batch b is `--episodes` validation levels
drawn from seed `--seed` + b, at the config's validation temperature. Per batch it records
success, the first turn's MI diagnostics (MI-ZScore, the MI estimate, retrieval accuracy) and,
for templated reasoning, how often the stated player cell (and holes or walls) are right.
Prints each policy's mean with a t interval over the batches, and the first policy minus each
other one, paired by batch. `--out FILE` also writes every batch's numbers as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from flax import nnx

KEYS = ("success", "mi/first_turn/mi_zscore", "mi/first_turn/mi_estimate", "mi/first_turn/retrieval_acc",
        "reasoning/player_right", "reasoning/walls_right", "reasoning/holes_right")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--workdirs", nargs="+", required=True)
    parser.add_argument("--names", nargs="+", help="one per workdir (default: the workdirs' names)")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=32, help="levels per batch")
    parser.add_argument("--seed", type=int, default=2000, help="batch b's levels and keys: seed + b")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = args.names or [Path(w).name for w in args.workdirs]
    if len(names) != len(args.workdirs) or args.batches < 2 or args.episodes < 2:
        parser.error("give one name per workdir, --batches >= 2 and --episodes >= 2")

    from ragen_jax.analysis.study import mean_t_interval
    from ragen_jax.cli.evaluate import validate_with_diagnostics
    from ragen_jax.cli.args import load_config
    from ragen_jax.run.experiment import make_experiment, restore_policy

    config = load_config(args.config, {})
    with config.unlocked():
        config.model.init = None  # every policy comes from its workdir
    exp = make_experiment(config)
    runs = {}
    for name, workdir in zip(names, args.workdirs):
        step, policy = restore_policy(workdir, None, nnx.state(exp.model))
        nnx.update(exp.model, policy)
        runs[name] = []
        for b in range(args.batches):
            eval_config = dataclasses.replace(exp.run.settings.eval, num_envs=args.episodes, samples_per_env=1,
                                              seed=args.seed + b)
            runs[name].append(validate_with_diagnostics(exp, eval_config)[0])
            shown = ", ".join(f"{k.rsplit('/', 1)[-1]} {runs[name][-1][k]:+.3f}" for k in KEYS if k in runs[name][-1])
            print(f"{name} (step {step}) batch {b}: {shown}", flush=True)
    print(f"\n{args.batches} batches × {args.episodes} levels; mean [95% t interval]")
    first = names[0]
    for key in KEYS:
        if not all(key in row for rows in runs.values() for row in rows):
            continue
        cells = []
        for name in names:
            mean, low, high = mean_t_interval([row[key] for row in runs[name]])
            cells.append(f"{name} {mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        for other in names[1:]:
            mean, low, high = mean_t_interval([a[key] - b[key] for a, b in zip(runs[first], runs[other])])
            cells.append(f"{first} − {other} {mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        print(f"{key}: " + "; ".join(cells))
    if args.out:
        args.out.write_text(json.dumps({"config": args.config, "episodes": args.episodes, "seed": args.seed,
                                        "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

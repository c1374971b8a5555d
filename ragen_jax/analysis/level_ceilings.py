"""What any policy could score on a config's validation levels under its turn structure.

`print_ceilings` reads the levels validation plays (`eval.seed`) and the config's turns, moves
per turn and move budget, and prints `ceilings`' bounds: FrozenLake's best and
shortest-path-replanning success with slip, Sokoban's share of levels solvable within the
budget. No model plays; the numbers bound what training can reach.
"""

from __future__ import annotations

from ragen_jax.analysis.run_configs import run_config


def print_ceilings(env: str, episodes: int, overrides: dict[str, str]) -> None:
    """The ceilings of `env`'s config (with `overrides`) over its first `episodes` validation levels."""
    import jax
    import numpy as np

    from ragen_jax.analysis import ceilings
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training.validation import EvalConfig

    config = run_config(env, 0, overrides)
    exp = make_experiment(config)
    eval_config = EvalConfig(num_envs=episodes, seed=config.eval.seed)
    rollout_config = eval_config.rollout_config(exp.run.step.rollout)
    states = eval_config.start_states(exp.env, exp.env_params, exp.run.step.rollout)
    turns, per_turn, budget = (rollout_config.max_turns, rollout_config.max_actions_per_turn,
                               rollout_config.max_actions_per_traj)
    level = lambda i: jax.tree.map(lambda a: np.asarray(a)[i], states)  # noqa: E731
    header = (f"{env}: {episodes} validation levels (eval.seed {config.eval.seed}), "
              f"{turns} turns × ≤{per_turn} moves, budget {budget}")
    if env == "frozenlake":
        rate = float(exp.env_params.success_rate)
        best, replan = [], []
        for i in range(episodes):
            s = level(i)
            best.append(ceilings.frozenlake_optimal(s.holes, s.player, s.goal, rate, turns, per_turn, budget)[0])
            replan.append(ceilings.frozenlake_replanning(s.holes, s.player, s.goal, rate, turns, per_turn, budget))
        print(f"{header}, slip: intended move w.p. {rate:.3f}")
        print(f"  best possible success              {np.mean(best):.3f}")
        print(f"  shortest-path replanning (the demos) {np.mean(replan):.3f}")
    else:
        solvable = [ceilings.solvable(exp.env, level(i), exp.env_params, budget) for i in range(episodes)]
        print(header)
        print(f"  solvable within the budget (best possible success) {np.mean(solvable):.3f}")

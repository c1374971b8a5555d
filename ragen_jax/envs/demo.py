"""Look at the environments: a few generated levels, then one episode played by the solver.

    python -m ragen_jax.envs.demo --env sokoban
    python -m ragen_jax.envs.demo --env LargerSokoban --levels 2 --seed 3
    python -m ragen_jax.envs.demo --env frozenlake --format grid_coord
"""

from __future__ import annotations

import argparse
import sys

import jax

from ragen_jax.envs import registry


def solvable_games() -> list[str]:
    """The registered names (and aliases) of the games with a solver, the ones the demo can play."""
    games = [(name, registry.entry(name).env) for name in registry.names()]
    return [name for name, env in games if env is not None and env.has_solver]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragen_jax.envs.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="sokoban", choices=solvable_games(), help="a game with a solver (it plays)")
    parser.add_argument("--levels", type=int, default=3, help="how many generated levels to print")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", default="grid", choices=("grid", "grid_coord"))
    args = parser.parse_args(argv)
    if args.levels < 1:
        parser.error(f"--levels must be >= 1, got {args.levels}")

    env, params = registry.make(args.env)
    reset = jax.jit(env.reset, static_argnums=1)
    step = jax.jit(env.step, static_argnums=3)
    key = jax.random.key(args.seed)
    states = [reset(k, params) for k in jax.random.split(key, args.levels)]
    for i, state in enumerate(states):
        plan = env.solve(state, params)
        length = "unsolvable" if plan is None else f"optimal solution: {len(plan)} moves"
        print(f"--- {args.env} level {i} (seed {args.seed}), {length} ---")
        print(env.render_text(state, params, args.format))
        print()

    print(f"=== Episode on level 0, solver actions (re-planned after every step) ===")
    state, total, step_key = states[0], 0.0, jax.random.fold_in(key, 1)
    print(env.render_text(state, params, args.format))
    for t in range(params.max_steps):
        plan = env.solve(state, params)
        if not plan:
            break
        action = plan[0]
        state, reward, done, info = step(jax.random.fold_in(step_key, t), state, action, params)
        total += float(reward)
        print(f"\nstep {t + 1}: {env.action_names[action - 1]}  reward {float(reward):+.1f}")
        print(env.render_text(state, params, args.format))
        if bool(done):
            break
    outcome = "success" if bool(state.success) else "not solved"
    print(f"\nepisode return {total:+.1f}, {outcome}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly, as command-line tools do
        sys.stderr.close()
        sys.exit(0)

"""Environment throughput, ours against the peers, measured in one run on this machine.

    python benchmarks/env_throughput.py [--batch 1024] [--seconds 3]

Ours: batch of `--batch` environments, jit+vmap, random actions, automatic resets with
procedural generation included (finished environments get freshly generated levels).
Peers: gym-sokoban (6x6, 1 box, as RAGEN uses it: one Python env, `step` renders an RGB
frame by default), gymnasium FrozenLake, and jumanji's Sokoban (dataset levels, no
generation) where jumanji is installed. Prints one line per comparison with the ratio.
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs import registry
from ragen_jax.envs.autoreset import AutoReset

warnings.filterwarnings("ignore")


def per_second(fn, count_per_call: int, seconds: float) -> float:
    """Calls fn repeatedly for about `seconds` (after one warm-up call); items per second."""
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls * count_per_call / (time.perf_counter() - start)


def ours(name: str, batch: int, seconds: float) -> dict[str, float]:
    """Batched resets/s, bare steps/s, and steps/s with auto-reset (levels generated)."""
    env, params = registry.make(name)
    reset = jax.jit(env.reset_batch, static_argnums=1)
    auto = AutoReset(env, params, batch=batch)
    counter = iter(range(10**9))

    def hundred_steps(step_fn):
        @jax.jit
        def run(key, carry):
            def body(carry, k):
                k_act, k_step = jax.random.split(k)
                actions = jax.random.randint(k_act, (batch,), 1, env.num_actions + 1)
                return step_fn(k_step, carry, actions), None

            return jax.lax.scan(body, carry, jax.random.split(key, 100))[0]

        return run

    def bare(key, states, actions):
        keys = jax.random.split(key, batch)
        return jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, states, actions, params)[0]

    def timed(run, carry):
        holder = {"carry": carry}

        def call():
            holder["carry"] = jax.block_until_ready(run(jax.random.key(next(counter)), holder["carry"]))

        return per_second(call, 100 * batch, seconds)

    keys = jax.random.split(jax.random.key(0), batch)
    return {
        "reset": per_second(lambda: jax.block_until_ready(reset(jax.random.split(jax.random.key(next(counter)), batch), params)), batch, seconds),
        "bare": timed(hundred_steps(bare), reset(keys, params)),
        "auto": timed(hundred_steps(lambda k, carry, actions: auto.step(carry, actions)[0]), jax.jit(auto.init)(jax.random.key(1))),
    }


def gym_sokoban(seconds: float) -> dict[str, float]:
    from gym_sokoban.envs.sokoban_env import SokobanEnv

    env = SokobanEnv(dim_room=(6, 6), max_steps=100, num_boxes=1)
    rng = np.random.default_rng(0)

    def step(mode):
        def run():
            _, _, done, _ = env.step(int(rng.integers(1, 5)), observation_mode=mode)
            if done:
                env.reset()

        return run

    return {
        "reset": per_second(env.reset, 1, seconds),
        "step": per_second(step("rgb_array"), 1, seconds),
        "step_tiny": per_second(step("tiny_rgb_array"), 1, seconds),
    }


def gymnasium_frozenlake(seconds: float) -> dict[str, float]:
    import gymnasium

    env = gymnasium.make("FrozenLake-v1", is_slippery=True)
    env.reset(seed=0)
    rng = np.random.default_rng(0)

    def step():
        _, _, terminated, truncated, _ = env.step(int(rng.integers(0, 4)))
        if terminated or truncated:
            env.reset()

    return {"reset": per_second(lambda: env.reset(), 1, seconds), "step": per_second(step, 1, seconds)}


def jumanji_sokoban(batch: int, seconds: float) -> dict[str, float] | None:
    """jumanji's Sokoban (10x10, 4 boxes, levels from a fixed toy dataset): bare and auto-reset."""
    try:
        from jumanji.environments.routing.sokoban import Sokoban
        from jumanji.environments.routing.sokoban.generator import ToyGenerator
        from jumanji.wrappers import AutoResetWrapper
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None
    results = {}
    for label, env in (("bare", Sokoban(generator=ToyGenerator())), ("auto", AutoResetWrapper(Sokoban(generator=ToyGenerator())))):
        states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), batch))

        @jax.jit
        def run_steps(key, states, env=env):
            def body(states, k):
                actions = jax.random.randint(k, (batch,), 0, 4)
                states, timestep = jax.vmap(env.step)(states, actions)
                return states, timestep.reward.sum()

            return jax.lax.scan(body, states, jax.random.split(key, 100))[0]

        holder = {"states": states, "i": 0}

        def steps(run_steps=run_steps, holder=holder):
            holder["i"] += 1
            holder["states"] = jax.block_until_ready(run_steps(jax.random.key(holder["i"]), holder["states"]))

        results[label] = per_second(steps, 100 * batch, seconds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, batch {args.batch}")

    gym = gym_sokoban(args.seconds)
    sok = ours("SimpleSokoban", args.batch, args.seconds)
    row = "{:<44} ours {:>12,.0f}   {:<28} {:>10,.0f}   ratio {:>7.2f}x"
    print(row.format("sokoban 6x6/1 box steps/s (auto-reset)", sok["auto"], "gym-sokoban rgb_array", gym["step"], sok["auto"] / gym["step"]))
    print(row.format("sokoban 6x6/1 box steps/s (auto-reset)", sok["auto"], "gym-sokoban tiny_rgb_array", gym["step_tiny"], sok["auto"] / gym["step_tiny"]))
    print(row.format("sokoban 6x6/1 box resets/s", sok["reset"], "gym-sokoban", gym["reset"], sok["reset"] / gym["reset"]))

    large = ours("LargerSokoban", args.batch, args.seconds)
    print(f"sokoban 8x8/2 box: ours resets/s {large['reset']:,.0f}, steps/s bare {large['bare']:,.0f}, auto-reset {large['auto']:,.0f}")

    lake = gymnasium_frozenlake(args.seconds)
    ours_lake = ours("FrozenLake", args.batch, args.seconds)
    print(row.format("frozenlake 4x4 steps/s (auto-reset)", ours_lake["auto"], "gymnasium", lake["step"], ours_lake["auto"] / lake["step"]))
    print(row.format("frozenlake 4x4 resets/s", ours_lake["reset"], "gymnasium", lake["reset"], ours_lake["reset"] / lake["reset"]))

    jumanji = jumanji_sokoban(args.batch, args.seconds)
    if jumanji is None:
        print("jumanji sokoban: not installed here (pip install jumanji to compare)")
    else:
        print(row.format("sokoban batched steps/s, bare", sok["bare"], "jumanji bare (no resets)", jumanji["bare"], sok["bare"] / jumanji["bare"]))
        print(row.format("sokoban steps/s, ours auto-reset+generation", sok["auto"], "jumanji bare (no resets)", jumanji["bare"], sok["auto"] / jumanji["bare"]))
        print(row.format("sokoban steps/s, both auto-reset", sok["auto"], "jumanji auto (dataset)", jumanji["auto"], sok["auto"] / jumanji["auto"]))


if __name__ == "__main__":
    main()

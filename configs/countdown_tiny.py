"""The CPU default on Countdown: the built-in tiny model (random weights: it runs, it does not
solve Countdown), one turn per episode, answers of up to 48 tokens; otherwise the sizes of
sokoban_tiny.py (`ragen_jax.run.config.tiny_cpu_config`)."""

from ragen_jax.run.config import tiny_cpu_config


def get_config():
    c = tiny_cpu_config("Countdown")
    c.rollout.update(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return c

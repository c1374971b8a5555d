"""The CPU default on FrozenLake (4×4, slippery: success_rate 1/3): the built-in tiny model,
the same sizes as sokoban_tiny.py. Slip makes rewards stochastic, which is where the paper's
reward-variance filtering matters most."""

from ragen_jax.config import default_config


def get_config():
    c = default_config()
    c.env.name = "FrozenLake"
    c.model.preset = "tiny"
    c.rollout.update(num_groups=8, group_size=8, max_turns=3, max_actions_per_traj=6, max_new_tokens=48)
    c.algo.update(name="ppo", actor_lr=1e-4, critic_lr=3e-4, mini_batch_size=16)
    c.diagnostics.update(num_samples=16, per_turn_samples=8, answer_tokens=16)
    c.train.update(steps=100, save_every=20, val_every=10)
    c.eval.update(num_envs=16)
    return c

"""The CPU default: the built-in tiny model and tokenizer on SimpleSokoban (6×6, 1 box).

Sized for a laptop CPU: 8 groups × 8 trajectories, 3 turns of up to 48 tokens, minibatches of
16, a learning rate for a 0.5M-parameter model. Everything else is the paper's (Top-p 0.9 on
reward std, PPO, MI diagnostics every 5 steps).
"""

from ragen_jax.config import default_config


def get_config():
    c = default_config()
    c.env.name = "SimpleSokoban"
    c.model.preset = "tiny"
    c.rollout.update(num_groups=8, group_size=8, max_turns=3, max_actions_per_traj=6, max_new_tokens=48)
    c.algo.update(name="ppo", actor_lr=1e-4, critic_lr=3e-4, mini_batch_size=16)
    c.diagnostics.update(num_samples=16, per_turn_samples=8, answer_tokens=16)
    c.train.update(steps=100, save_every=20, val_every=10)
    c.eval.update(num_envs=16)
    return c

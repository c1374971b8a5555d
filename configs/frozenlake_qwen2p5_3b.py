"""The paper's setting (SPEC §3–§4) on FrozenLake with a local Qwen2.5-3B-Instruct checkpoint.

    python -m ragen_jax.train --config configs/frozenlake_qwen2p5_3b.py \
        --config.model.path=/path/to/Qwen2.5-3B-Instruct --workdir runs/frozenlake_qwen2p5_3b

8 groups × 16 trajectories, 5 turns of up to 120 tokens, PPO (actor lr 1e-6, critic lr 1e-5),
Top-p 0.9 reward-variance filtering, MI diagnostics every 5 steps, bfloat16 compute. Mesh:
FSDP over the devices.
"""

from ragen_jax.config import default_config


def get_config():
    c = default_config()
    c.env.name = "FrozenLake"
    c.model.update(preset="", path="", dtype="bfloat16", remat=True)  # model.path is required: set it on the command line
    c.rollout.update(num_groups=8, group_size=16, max_turns=5, max_new_tokens=120)
    c.algo.update(name="ppo", mini_batch_size=32, micro_batch_size=8)
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    c.train.update(steps=400, save_every=25, val_every=10)
    c.eval.update(num_envs=64)
    return c

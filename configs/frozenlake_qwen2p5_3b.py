"""The paper's setting on FrozenLake with a local Qwen2.5-3B-Instruct checkpoint (FSDP over all devices).

    python -m ragen_jax.train --config configs/frozenlake_qwen2p5_3b.py \
        --config.model.path=/path/to/Qwen2.5-3B-Instruct --workdir runs/frozenlake_qwen2p5_3b

8 groups × 16 trajectories, 5 turns of up to 120 tokens, PPO (actor lr 1e-6, critic lr 1e-5),
Top-p 0.9 reward-variance filtering, MI diagnostics every 5 steps, bfloat16 compute
(`ragen_jax.run.config.paper_config`)."""

from ragen_jax.run.config import paper_config


def get_config():
    return paper_config("FrozenLake", fsdp=True)

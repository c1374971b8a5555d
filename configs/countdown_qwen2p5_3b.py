"""The paper's setting on Countdown with a local Qwen2.5-3B-Instruct checkpoint (FSDP over all devices).

    python -m ragen_jax.train --config configs/countdown_qwen2p5_3b.py \
        --config.model.path=/path/to/Qwen2.5-3B-Instruct --workdir runs/countdown_qwen2p5_3b

8 groups × 16 trajectories, one turn of up to 120 tokens (an episode is one answer), PPO
(actor lr 1e-6, critic lr 1e-5), Top-p 0.9 reward-variance filtering, MI diagnostics every 5
steps, bfloat16 compute (`ragen_jax.run.config.paper_config`)."""

from ragen_jax.run.config import paper_config


def get_config():
    c = paper_config("Countdown", fsdp=True)
    c.rollout.update(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return c

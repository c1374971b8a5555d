"""The paper's PPO on SimpleSokoban with Qwen2.5-0.5B-Instruct as it fits one TPU v5e chip
(Colab's TPU runtime), the MI diagnostics on: LoRA adapters of rank 16 on the policy and the
critic. The TPU compiler plans its step at a peak of 11.25 GiB of the chip's 15.75
(docs/scaling.md); every weight trained needs more than 17.55 GiB with bfloat16 moments
(15.91 GiB with bfloat16 weights too), and fits only with the diagnostics off.

    python -m ragen_jax.plan --config configs/sokoban_qwen2p5_0p5b_ppo_v5e1.py --model qwen2.5-0.5b --target v5e-1
    python -m ragen_jax.train --config configs/sokoban_qwen2p5_0p5b_ppo_v5e1.py \\
        --config.model.path=Qwen/Qwen2.5-0.5B-Instruct --workdir runs/sokoban_0p5b_ppo_v5e1
"""

from ragen_jax.run.config import paper_config


def get_config():
    c = paper_config("SimpleSokoban", fsdp=False)
    c.model.lora.rank = 16
    return c

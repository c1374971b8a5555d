"""The paper's PPO on SimpleSokoban with Qwen2.5-0.5B-Instruct as it fits one TPU v5e chip
(Colab's TPU runtime), every weight trained in float32, the MI diagnostics on: Adam's moments in
bfloat16 and micro-batches of 4 rows. The TPU compiler plans its step at a peak of 14.01 GiB of
the chip's 15.75 (docs/scaling.md); with float32 moments it needs more than 18.8 GiB.

    python -m ragen_jax.plan --config configs/sokoban_qwen2p5_0p5b_ppo_v5e1.py --model qwen2.5-0.5b --target v5e-1
    python -m ragen_jax.train --config configs/sokoban_qwen2p5_0p5b_ppo_v5e1.py \\
        --config.model.path=Qwen/Qwen2.5-0.5B-Instruct --workdir runs/sokoban_0p5b_ppo_v5e1
"""

from ragen_jax.run.config import paper_config


def get_config():
    c = paper_config("SimpleSokoban", fsdp=False)
    c.algo.update(adam_moments="bfloat16", micro_batch_size=4)
    return c

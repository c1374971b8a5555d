"""The paper's setting on SimpleSokoban as it fits one TPU v5e chip (Colab's TPU runtime) with
Qwen2.5-0.5B-Instruct, every weight trained in float32: GRPO (no critic). The TPU compiler plans
its step at a peak of 12.76 GiB of the chip's 15.75 (docs/scaling.md); for the paper's PPO on
one chip see `sokoban_qwen2p5_0p5b_ppo_v5e1.py`.

    python -m ragen_jax.plan --config configs/sokoban_qwen2p5_0p5b_v5e1.py --model qwen2.5-0.5b --target v5e-1
    python -m ragen_jax.train --config configs/sokoban_qwen2p5_0p5b_v5e1.py \\
        --config.model.path=Qwen/Qwen2.5-0.5B-Instruct --workdir runs/sokoban_0p5b_v5e1
"""

from ragen_jax.run.config import one_chip_config


def get_config():
    return one_chip_config("SimpleSokoban")

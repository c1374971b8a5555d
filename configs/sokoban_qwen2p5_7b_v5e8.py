"""The paper's setting on SimpleSokoban with Qwen2.5-7B-Instruct on a TPU v5e-8 (8 chips of
16 GiB): PPO with LoRA adapters of rank 16, the model split over fsdp × tensor = 4 × 2. The TPU
compiler plans its step at a peak of 11.96 GiB a chip (docs/scaling.md); over fsdp 8 alone the
same step needs 15.89–15.98 GiB of the chip's 15.75, mostly for the embedding and the LM head
gathered whole, which the tensor axis halves.

    python -m ragen_jax.plan --config configs/sokoban_qwen2p5_7b_v5e8.py --model qwen2.5-7b --target v5e-8
    python -m ragen_jax.train --config configs/sokoban_qwen2p5_7b_v5e8.py \\
        --config.model.path=Qwen/Qwen2.5-7B-Instruct --workdir runs/sokoban_7b_v5e8
"""

from ragen_jax.run.config import paper_config


def get_config():
    c = paper_config("SimpleSokoban", fsdp=True)
    c.model.lora.rank = 16
    c.mesh.update(fsdp=-1, tensor=2)
    return c

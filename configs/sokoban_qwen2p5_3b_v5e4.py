"""The paper's own run — Qwen2.5-3B-Instruct, PPO, every weight trained, on SimpleSokoban — on a
TPU v5e-4 (4 chips of 16 GiB), half the paper's v5e-8: the weights and Adam's
moments in bfloat16, each update added to a weight with stochastic rounding (the paper's 1e-6
steps are below a bfloat16 weight's precision and rounded to nearest would be lost;
ragen_jax/rl/rounding.py), the models split over fsdp × tensor = 2 × 2. The TPU compiler plans
its step at a peak of 14.56 GiB a chip (docs/scaling.md); with float32 weights it needs more than
23.93 GiB even with bfloat16 moments.

    python -m ragen_jax.plan --config configs/sokoban_qwen2p5_3b_v5e4.py --model qwen2.5-3b --target v5e-4
    python -m ragen_jax.train --config configs/sokoban_qwen2p5_3b_v5e4.py \\
        --config.model.path=Qwen/Qwen2.5-3B-Instruct --workdir runs/sokoban_3b_v5e4
"""

from ragen_jax.run.config import paper_config


def get_config():
    c = paper_config("SimpleSokoban", fsdp=True)
    c.model.param_dtype = "bfloat16"
    c.algo.update(adam_moments="bfloat16", weight_rounding="stochastic")
    c.mesh.update(fsdp=-1, tensor=2)
    return c

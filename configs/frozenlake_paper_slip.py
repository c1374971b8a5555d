"""FrozenLake as the paper's: the lake slips on 2% of moves (a move goes where it was meant to
with probability 0.98, otherwise to one side, as gymnasium's slip) — the rest is
frozenlake_tiny.py. It is the base of the paper's stochasticity axis: `--config.env.reward_noise=q`
replaces each finished episode's reward, with probability q, by the reward of an episode drawn
from the same batch (docs/method.md, "Random rewards"; `python benchmarks/reproduce.py study
--part reward_noise` runs Top-p against no filter at q = 0, 0.2, 0.5 and 0.9)."""

from pathlib import Path

from ragen_jax.run.config import load_config_file


def get_config():
    c = load_config_file(str(Path(__file__).with_name("frozenlake_tiny.py")))
    c.env.success_rate = 0.98
    return c

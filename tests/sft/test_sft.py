"""Supervised warm start: demonstrations in the rollout's exact format, grounded reasoning,
the fit lowers the loss, and the shipped warm starts load and play."""

import re

import jax
import numpy as np
import pytest

from agent_setup import text_parts, tiny_model
from ragen_jax import sft
from ragen_jax.rollout import RolloutConfig

CONFIG = RolloutConfig(num_groups=12, group_size=1, max_turns=3, max_actions_per_turn=2, max_actions_per_traj=6,
                       max_new_tokens=48)


@pytest.fixture(scope="module", params=["SimpleSokoban", "FrozenLake"])
def demos(request):
    env, params, tok, codec, prompt = text_parts(request.param, CONFIG.max_actions_per_turn)
    params = sft.deterministic(env, params)
    traj = sft.demonstrations(jax.random.key(0), env, params, codec, prompt, tok, CONFIG, noise=0.0)
    return env, tok, traj


def turn_texts(tok, traj, b, t):
    """(observation text, generated text) of turn t of row b, from the buffer."""
    tokens, mask = np.asarray(traj.tokens[b]), np.asarray(traj.mask[b])
    start = traj.turn_offsets[t]
    prev = traj.turn_offsets[t - 1] if t else 0
    obs = tok.decode(tokens[prev:start][mask[prev:start]])
    gen = tok.decode(tokens[start:start + CONFIG.max_new_tokens][mask[start:start + CONFIG.max_new_tokens]])
    return obs, gen


def test_demonstrations_are_valid_turns_that_solve_most_levels(demos):
    env, _, traj = demos
    active, valid = np.asarray(traj.turn_active), np.asarray(traj.turn_valid)
    assert active.any() and valid[active].all()  # every demonstrated turn parses
    assert np.asarray(traj.success).mean() >= 0.75  # the solver's plans fit the budget mostly
    assert np.asarray(traj.loss_mask).sum() == np.asarray(traj.gen_lengths).sum()


def test_reasoning_names_the_current_state(demos):
    """The reasoning's player coordinates are where `P` stands on that turn's board."""
    env, tok, traj = demos
    checked = 0
    for b in range(CONFIG.batch):
        for t in range(CONFIG.max_turns):
            if not bool(traj.turn_active[b, t]):
                continue
            obs, gen = turn_texts(tok, traj, b, t)
            board = obs.split("State:\n")[-1].split("\nYou have")[0].splitlines()
            cells = [line.split(" ") for line in board]
            where = [(r, c) for r, row in enumerate(cells) for c, s in enumerate(row) if s in ("P", "S")]
            said = re.search(r"Player \((\d+), (\d+)\)", gen)
            assert said and where and (int(said[1]), int(said[2])) == where[0], (obs, gen)
            checked += 1
    assert checked >= CONFIG.batch


def test_fit_lowers_the_loss(demos):
    env, tok, traj = demos
    model = tiny_model(1)
    losses = sft.fit(model, traj, sft.SFTConfig(epochs=4, batch_size=4, lr=3e-3, warmup_steps=1),
                     CONFIG.max_new_tokens, log=lambda _: None)
    assert losses[-1] < 0.8 * losses[0], losses


def test_the_shipped_warm_start_loads_and_plays():
    """configs/sokoban_tiny.py starts from the shipped warm start, which already solves levels."""
    from flax import nnx

    from ragen_jax.config import load_config_file
    from ragen_jax.evaluation import EvalConfig, Validator
    from ragen_jax.experiment import make_experiment

    config = load_config_file("configs/sokoban_tiny.py")
    assert config.model.init.startswith("builtin:")
    config.mesh.data = 1
    exp = make_experiment(config)
    validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt,
                          EvalConfig(num_envs=32, temperature=0.5, seed=5), exp.run.step.rollout)
    metrics, _ = validator(nnx.state(exp.model))
    assert metrics["valid_action_rate"] > 0.9 and metrics["success"] > 0.1, metrics

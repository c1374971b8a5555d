"""Supervised warm start: demonstrations in the rollout's exact format, grounded reasoning,
the fit lowers the loss, and the shipped warm starts load, play and read the board."""

import re
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.training import sft

from agent_setup import TEST_LAYERS, text_parts, tiny_model

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
    start = traj.layout.generation_offsets[t]
    prev = traj.layout.generation_offsets[t - 1] if t else 0
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


@pytest.mark.parametrize("game, kind, steps", [
    ("FrozenLake", "holes", {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}),
    ("SimpleSokoban", "walls", {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)})])
def test_the_reasoning_can_name_the_moves_into_holes_or_walls(game, kind, steps):
    """With `name_blocked` the first turn's reasoning also lists, in the game's action order, the
    moves from the start into a hole (FrozenLake) or a wall (Sokoban), a plain loop over the
    board's grid; without, it does not."""
    import dataclasses

    from ragen_jax.rollout.play import initial_states

    env, params, *_ = text_parts(game, CONFIG.max_actions_per_turn)
    params = sft.deterministic(env, params)
    config = dataclasses.replace(CONFIG, num_groups=48)
    states = initial_states(jax.random.key(1), env, params, config)
    named = sft.demonstration_texts(env, params, states, config, np.random.default_rng(0), 0.0, name_blocked=True)
    plain = sft.demonstration_texts(env, params, states, config, np.random.default_rng(0), 0.0)
    counts = set()
    for b in range(config.batch):
        blocked = np.asarray(states.holes[b]) if kind == "holes" else np.asarray(states.room_fixed[b]) == 0  # wall
        r, c = np.asarray(states.player[b])
        near = [name for name, (dr, dc) in steps.items()
                if 0 <= r + dr < blocked.shape[0] and 0 <= c + dc < blocked.shape[1] and blocked[r + dr, c + dc]]
        clause = f", {kind}: {', '.join(near) or 'none'}."
        assert clause in named[b][0], (near, named[b][0])
        assert plain[b][0] == named[b][0].replace(clause, "."), (plain[b][0], named[b][0])
        counts.add(len(near))
    assert len(counts) > 1  # the clause changes with the board


def test_compacting_the_holes_away_changes_no_log_prob(demos):
    """batch.compact (used by the fit) moves valid slots to the front: shorter rows, same numbers."""
    from ragen_jax.rl.batch import batch_from_trajectories, compact, policy_logprobs

    _, _, traj = demos
    batch = batch_from_trajectories(traj)
    short = compact(batch, multiple=8)
    assert short.tokens.shape[1] < batch.tokens.shape[1]
    assert short.tokens.shape[1] % 8 == 0 or short.tokens.shape[1] == batch.tokens.shape[1]
    assert int(short.mask.sum()) == int(batch.mask.sum())
    model = tiny_model(2, TEST_LAYERS)
    logprobs = nnx.jit(lambda m, b: policy_logprobs(m, b, 1.0)[0])
    want, got = logprobs(model, batch), logprobs(model, short)
    mask = np.asarray(batch.loss_mask)
    assert mask.sum() > 0
    np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(want)[mask], atol=1e-5)


def test_fit_lowers_the_loss(demos):
    env, tok, traj = demos
    model = tiny_model(1, TEST_LAYERS)
    losses = sft.fit(model, traj, sft.SFTConfig(epochs=4, batch_size=4, lr=3e-3, warmup_steps=1),
                     log=lambda _: None)
    assert losses[-1] < 0.8 * losses[0], losses


def test_the_fit_shows_its_progress_and_keeps_its_numbers(demos, capsys):
    """With `progress` the fit draws train's bar on stderr: steps done of the total, the last
    step's loss, time spent and left; each epoch's line goes above it, not onto it. The losses
    are exactly those of the same fit without the bar."""
    _, _, traj = demos
    config = sft.SFTConfig(epochs=2, batch_size=4, lr=3e-3, warmup_steps=1)
    quiet = sft.fit(tiny_model(1, TEST_LAYERS), traj, config, log=lambda _: None)
    assert capsys.readouterr().err == ""
    shown = sft.fit(tiny_model(1, TEST_LAYERS), traj, config, log=lambda line: print(line, file=sys.stderr),
                    progress=True)
    assert shown == quiet
    err = capsys.readouterr().err
    total = traj.tokens.shape[0] // config.batch_size * config.epochs
    states = [state for line in err.split("\n") for state in line.split("\r")]
    last = [state for state in states if f"{total}/{total}" in state][-1]
    assert re.match(rf"sft: 100%.* {total}/{total} \[\d\d:\d\d<00:00, .*loss=\d+\.\d{{4}}\]$", last), last
    assert any(re.search(rf" 1/{total} \[\d\d:\d\d<\d\d:\d\d", state) for state in states), err  # time left
    lines = [line.rsplit("\r", 1)[-1] for line in err.split("\n")]
    assert [line for line in lines if line.startswith("epoch")] == [
        f"epoch {e + 1}/2: loss {loss:.4f}" for e, loss in enumerate(shown)], err


def test_a_fit_continued_from_its_step_ends_where_one_fit_ends(demos):
    """`start=(step, params, opt)` (a stopped fit's checkpoint) runs the minibatches that fit
    had left, so the weights end bit for bit where an uninterrupted fit's do; `after_step`
    sees every step once, in order."""
    _, _, traj = demos
    config = sft.SFTConfig(episodes=12, epochs=2, batch_size=4, lr=3e-3, warmup_steps=1)
    seen, kept = [], {}

    def after_step(step, params, opt, loss):
        seen.append(step)
        if step == 4:  # mid-way through the second epoch (3 steps an epoch)
            kept["start"] = (step, params, opt)

    whole = tiny_model(1, TEST_LAYERS)
    sft.fit(whole, traj, config, log=lambda _: None, after_step=after_step)
    assert seen == list(range(1, sft.total_steps(config) + 1)) == [1, 2, 3, 4, 5, 6]
    continued = tiny_model(7, TEST_LAYERS)  # other initial weights: all of them come from `start`
    later = []
    losses = sft.fit(continued, traj, config, log=lambda _: None, start=kept["start"],
                     after_step=lambda step, *_: later.append(step))
    assert later == [5, 6] and len(losses) == 1  # the second epoch's two remaining steps
    for a, b in zip(jax.tree.leaves(nnx.state(whole)), jax.tree.leaves(nnx.state(continued))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("demos", ["SimpleSokoban"], indirect=True)  # one game is enough here
def test_a_fit_in_micro_batches_takes_the_whole_minibatchs_steps(demos):
    """Minibatches of 4 rows run 2 at a time (the run config's `algo.micro_batch_size`, as a
    fit of a real model needs on one TPU chip) take the same steps as 4 at once: the same
    losses and weights up to float summation order."""
    _, _, traj = demos
    config = sft.SFTConfig(episodes=12, epochs=1, batch_size=4, lr=3e-3, warmup_steps=1)
    whole, micro = tiny_model(1, TEST_LAYERS), tiny_model(1, TEST_LAYERS)
    want = sft.fit(whole, traj, config, log=lambda _: None)
    got = sft.fit(micro, traj, config, log=lambda _: None, micro_batch=sft.fit_micro_batch(4, 2))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(nnx.state(whole)), jax.tree.leaves(nnx.state(micro))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)
    assert not np.allclose(np.asarray(jax.tree.leaves(nnx.state(whole))[0]),
                           np.asarray(jax.tree.leaves(nnx.state(tiny_model(1, TEST_LAYERS)))[0]))  # it moved


@pytest.mark.parametrize("batch, micro, rows", [(32, 8, 8), (32, 0, None), (32, "auto", None), (8, 8, None),
                                                (8, 16, None)])
def test_the_fits_micro_batch_is_the_configs_where_it_is_smaller(batch, micro, rows):
    assert sft.fit_micro_batch(batch, micro) == rows


def test_a_micro_batch_that_does_not_divide_the_fits_batch_is_refused():
    with pytest.raises(ValueError, match="--batch-size=12 must be a multiple of algo.micro_batch_size=8"):
        sft.fit_micro_batch(12, 8)


def test_stochastic_rounding_lets_the_fits_1e_6_steps_move_bfloat16_weights():
    """bfloat16 weights fitted at lr 1e-6 (an Adam step of about 1e-6 per weight): rounded to
    nearest, no weight above 0.01 in magnitude moves (their spacing is at least 6e-5); with
    `weight_rounding="stochastic"` some do, and a fit continued from a step ends bit for bit
    where the whole fit does (step k's key is the seed's folded with k)."""
    from ragen_jax.models.config import DecoderConfig
    from ragen_jax.models.decoder import init_model

    one_turn = RolloutConfig(num_groups=4, group_size=1, max_turns=1, max_actions_per_turn=2, max_actions_per_traj=2,
                             max_new_tokens=48)
    env, params, tok, codec, prompt = text_parts("SimpleSokoban", one_turn.max_actions_per_turn)
    traj = sft.demonstrations(jax.random.key(0), env, sft.deterministic(env, params), codec, prompt, tok, one_turn,
                              noise=0.0)
    config = sft.SFTConfig(episodes=4, epochs=2, batch_size=2, lr=1e-6, warmup_steps=1)
    bfloat16 = DecoderConfig.preset("tiny", num_layers=TEST_LAYERS, param_dtype="bfloat16")
    flat = lambda model: np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(nnx.state(model))])

    def fitted(rounding, **kwargs):
        model = init_model(bfloat16, jax.random.key(1))
        sft.fit(model, traj, config, log=lambda _: None, weight_rounding=rounding, **kwargs)
        return flat(model)

    initial = flat(init_model(bfloat16, jax.random.key(1)))
    large = np.abs(initial) > 0.01
    assert np.array_equal(fitted("nearest")[large], initial[large])
    kept = {}
    stochastic = fitted("stochastic", after_step=lambda step, params, opt, loss: kept.setdefault(
        "start", (step, params, opt)) if step == 2 else None)
    moved = np.mean(stochastic[large] != initial[large])
    assert 1e-3 < moved < 0.2, moved  # ≈ 1e-6 / spacing a step: about 1% a step with lr > 0
    np.testing.assert_array_equal(fitted("stochastic", start=kept["start"]), stochastic)


@pytest.mark.parametrize("env, init", [("sokoban", ""), ("frozenlake", ""), ("frozenlake", "builtin:frozenlake-tiny")])
def test_the_shipped_warm_start_loads_plays_and_reads_the_board(env, init):
    """configs/<env>_tiny.py starts from a shipped warm start (init "": the config's own; on
    FrozenLake also the one before the noisy default, which the study runs from), which solves
    levels and whose reasoning states the player's cell of the board it was shown (a board-blind
    policy gives RL nothing to reinforce; ragen_jax.diagnostics.reasoning_check)."""
    from ragen_jax.diagnostics import reasoning_check
    from ragen_jax.core import distributed
    from ragen_jax.run.config import load_config_file
    from ragen_jax.run.experiment import make_experiment
    from ragen_jax.training.validation import EvalConfig, validate

    config = load_config_file(f"configs/{env}_tiny.py")
    assert config.model.init.startswith(f"builtin:{env}-tiny")
    config.model.init = init or config.model.init
    config.mesh.data = 1
    exp = make_experiment(config)
    metrics, traj = validate(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt,
                             EvalConfig(num_envs=32, temperature=0.5, seed=5), exp.run.step.rollout)
    assert metrics["valid_action_rate"] > 0.9 and metrics["success"] > 0.1, metrics
    scores = reasoning_check.validation_metrics(distributed.to_host(traj), exp.tokenizer, exp.env, exp.env_params)
    assert scores["reasoning/player_stated"] > 0.9 and scores["reasoning/player_right"] > 0.5, scores  # blind: ~0.06

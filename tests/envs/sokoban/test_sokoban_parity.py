"""Step parity with the real gym-sokoban: same room in both, same actions, same everything."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gym_sokoban_ref import gym_generate_room, make_gym_env
from ragen_jax.envs.sokoban import LARGER_SOKOBAN, SIMPLE_SOKOBAN, SOKOBAN
from ragen_jax.envs.solver import solve_sokoban

NUM_SEQUENCES = 120  # per preset; 240 in all
SEQUENCE_LENGTH = 40
MAX_STEPS = 30  # shorter than the sequences, so truncation is exercised too


def _action_sequences(rng, plans):
    """Half purely random, half the solver's plan with random detours (so successes,
    pushes onto and off targets all occur)."""
    sequences = np.zeros((len(plans), SEQUENCE_LENGTH), np.int32)
    for i, plan in enumerate(plans):
        if i % 2 == 0:
            sequences[i] = rng.integers(1, 5, SEQUENCE_LENGTH)
            continue
        seq = []
        for action in plan:
            if rng.random() < 0.3:
                seq.append(int(rng.integers(1, 5)))
            seq.append(action)
        seq += list(rng.integers(1, 5, SEQUENCE_LENGTH))
        sequences[i] = seq[:SEQUENCE_LENGTH]
    return sequences


@pytest.mark.parametrize("preset", [SIMPLE_SOKOBAN, LARGER_SOKOBAN], ids=["simple", "larger"])
def test_step_parity_with_gym_sokoban(preset):
    params = preset.replace(max_steps=MAX_STEPS)
    rng = np.random.default_rng(0)
    ours = SOKOBAN.reset_batch(jax.random.split(jax.random.key(7), NUM_SEQUENCES - 8), params)
    fixed = [np.asarray(x) for x in ours.room_fixed]
    rooms = [np.asarray(x) for x in ours.room_state]
    for seed in range(8):  # a few levels from gym-sokoban's own generator as well
        f, r = gym_generate_room(params.dim_room, params.num_boxes, params.search_depth, seed)
        fixed.append(f)
        rooms.append(r)
    plans = [solve_sokoban(f == 0, f == 2, (r == 3) | (r == 4), np.argwhere(r == 5)[0]) for f, r in zip(fixed, rooms)]
    actions = _action_sequences(rng, plans)

    states = jax.vmap(SOKOBAN.state_from_rooms, in_axes=(0, 0, None))(np.stack(fixed), np.stack(rooms), params)

    def play(state, action_column):
        state, reward, done, info = jax.vmap(SOKOBAN.step, in_axes=(None, 0, 0, None))(
            jax.random.key(0), state, action_column, params
        )
        return state, (state.room_state, reward, done, info["success"], info["action_is_effective"])

    _, (grids, rewards, dones, successes, effective) = jax.jit(lambda s, a: jax.lax.scan(play, s, a.T))(states, actions)
    grids, rewards, dones = np.asarray(grids), np.asarray(rewards), np.asarray(dones)
    successes, effective = np.asarray(successes), np.asarray(effective)

    outcomes = {"success": 0, "truncated": 0, "box_on": 0, "box_off": 0}
    for i in range(len(fixed)):
        env = make_gym_env(fixed[i], rooms[i], MAX_STEPS, params.num_boxes)
        for t in range(SEQUENCE_LENGTH):
            _, reward, done, info = env.step(int(actions[i, t]), observation_mode="tiny_rgb_array")
            np.testing.assert_array_equal(grids[t, i], env.room_state, err_msg=f"level {i} step {t}")
            assert rewards[t, i] == pytest.approx(reward, abs=1e-6), (i, t)
            assert dones[t, i] == done, (i, t)
            assert effective[t, i] == info["action.moved_player"], (i, t)
            outcomes["box_on"] += reward > 0.5
            outcomes["box_off"] += reward < -0.5
            if done:
                assert successes[t, i] == info["all_boxes_on_target"]
                outcomes["success" if info["all_boxes_on_target"] else "truncated"] += 1
                # After the end our env stays put: reward 0, done, grid frozen.
                assert np.all(rewards[t + 1 :, i] == 0) and np.all(dones[t + 1 :, i])
                assert np.all(grids[t + 1 :, i] == grids[t, i])
                break
    # The sequences really exercised every kind of outcome (with one box, pushing it onto
    # its target ends the episode, so it can never be pushed off again).
    if params.num_boxes == 1:
        del outcomes["box_off"]
    assert min(outcomes.values()) >= 5, outcomes

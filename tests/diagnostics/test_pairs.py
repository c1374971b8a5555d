"""Pair sets picked from rollout buffers equal a plain NumPy slicing of the same buffers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.diagnostics import pairs as P
from ragen_jax.diagnostics.mi import MIEmaState, equivalent_columns, mi_metrics

from diag_synthetic import build, random_rows

GROUPS, SIZE, TURNS, OBS, GEN, ANSWER = 3, 4, 3, 5, 6, 3
BATCH = GROUPS * SIZE


def make(seed, late_turn_rows=None):
    """Random buffers of fixed shapes; `late_turn_rows` trajectories play the last turn."""
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, GROUPS, SIZE, TURNS, OBS, GEN)
    if late_turn_rows is not None:
        for b, row in enumerate(rows):
            while len(row) < TURNS:
                row.append((rng.integers(3, 900, 2), rng.integers(3, 900, 3), 1))
            if b >= late_turn_rows:
                del row[TURNS - 1 :]
    rows[0] += [(rng.integers(3, 900, 2), rng.integers(3, 900, 2), 1)] * (TURNS - len(rows[0]))  # shapes fixed
    return build(rng.integers(3, 900, 4), rows, OBS, GEN), rows


def np_prompt(traj, b, t, width):
    """The valid slots of row b before turn t's generation, in the buffer layout."""
    tokens, mask = np.asarray(traj.tokens), np.asarray(traj.mask)
    keep = mask[b, :width] & (np.arange(width) < traj.layout.generation_offsets[t])
    return np.where(keep, tokens[b, :width], 0), keep


def np_generation(rows, b, t):
    obs, gen, r = rows[b][t]
    return np.asarray(gen[:r]), np.asarray(gen[r : r + ANSWER])


def check_rows(traj, rows, pairs, samples):
    """Every drawn row's z and a are the slices of its generation; flags follow the data."""
    r_len = np.asarray(traj.reasoning_lengths)
    for i, (b, t) in enumerate(zip(np.asarray(pairs.rows), np.asarray(pairs.turns))):
        assert t < len(rows[b]), "a sample at a turn the trajectory did not play"
        z, a = np_generation(rows, b, t)
        got = np.asarray(samples.tokens[i])
        np.testing.assert_array_equal(got[np.asarray(samples.reasoning_mask[i])], z)
        np.testing.assert_array_equal(got[np.asarray(samples.answer_mask[i])], a)
        np.testing.assert_array_equal(np.asarray(samples.answer[i])[np.asarray(samples.answer_only_mask[i])], a)
        assert bool(pairs.valid[i]) == (bool(pairs.drawn[i]) and r_len[b, t] > 0)


_FIRST = jax.jit(lambda traj, key: P.first_turn_pairs(traj, key, 8, SIZE))
_TRAJ = jax.jit(lambda traj, key: P.trajectory_pairs(traj, key, 8))
_TURN = jax.jit(lambda traj, key, turn: P.turn_pairs(traj, key, turn, 5))
_SAMPLES = jax.jit(functools.partial(P.samples, answer_tokens=ANSWER))
_PROMPTS = jax.jit(P.prompts)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_first_turn_pairs_match_buffer_slicing(seed):
    traj, rows = make(seed)
    pairs = _FIRST(traj, jax.random.key(seed))
    sampled = np.asarray(pairs.rows)
    assert len(set(sampled.tolist())) == len(sampled) == 8  # without replacement
    np.testing.assert_array_equal(np.asarray(pairs.true_column), sampled // SIZE)
    np.testing.assert_array_equal(np.asarray(pairs.turns), 0)
    assert np.asarray(pairs.drawn).all()
    ids, mask = _PROMPTS(traj, pairs)
    assert ids.shape == (GROUPS, traj.layout.generation_offsets[0])
    for g in range(GROUPS):  # the group's prompt: its first member's first turn, = every member's
        for member in range(SIZE):
            want_ids, want_mask = np_prompt(traj, g * SIZE + member, 0, traj.layout.generation_offsets[0])
            np.testing.assert_array_equal(np.asarray(mask[g]), want_mask)
            np.testing.assert_array_equal(np.asarray(ids[g]), want_ids)
    check_rows(traj, rows, pairs, _SAMPLES(traj, pairs))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_trajectory_pairs_match_buffer_slicing(seed):
    traj, rows = make(seed)
    pairs = _TRAJ(traj, jax.random.key(seed))
    sampled, turns = np.asarray(pairs.rows), np.asarray(pairs.turns)
    assert len(set(sampled.tolist())) == 8
    np.testing.assert_array_equal(np.asarray(pairs.column_rows), sampled)
    np.testing.assert_array_equal(np.asarray(pairs.column_turns), turns)
    np.testing.assert_array_equal(np.asarray(pairs.true_column), np.arange(8))
    ids, mask = _PROMPTS(traj, pairs)
    width = traj.layout.generation_offsets[-1]
    for j, (b, t) in enumerate(zip(sampled, turns)):
        want_ids, want_mask = np_prompt(traj, b, t, width)
        np.testing.assert_array_equal(np.asarray(mask[j]), want_mask)
        np.testing.assert_array_equal(np.asarray(ids[j]), want_ids)
        # the prompt is the system, then whole earlier turns, then this turn's observation
        text = [tok for tok, keep in zip(want_ids, want_mask) if keep]
        expected = list(np.asarray(traj.tokens)[b, :4])
        for tt in range(t):
            expected += list(rows[b][tt][0]) + list(rows[b][tt][1])
        expected += list(rows[b][t][0])
        assert text == expected
    check_rows(traj, rows, pairs, _SAMPLES(traj, pairs))


def test_turn_pairs_with_few_active_trajectories():
    traj, rows = make(1, late_turn_rows=3)  # only 3 trajectories play the last turn
    last = TURNS - 1
    pairs = _TURN(traj, jax.random.key(0), last)
    drawn, sampled = np.asarray(pairs.drawn), np.asarray(pairs.rows)
    np.testing.assert_array_equal(drawn, [True] * 3 + [False] * 2)
    assert sorted(sampled[:3].tolist()) == [0, 1, 2]
    np.testing.assert_array_equal(sampled[3:], sampled[: 2])  # repeats fill the static shape
    assert not np.asarray(pairs.valid)[3:].any()
    np.testing.assert_array_equal(np.asarray(pairs.turns), last)
    check_rows(traj, rows, pairs, _SAMPLES(traj, pairs))
    # repeated columns are identical prompts, hence equivalent
    eq = np.asarray(equivalent_columns(*_PROMPTS(traj, pairs)))
    assert eq[3, 0] and eq[4, 1]

    # a turn nobody plays: every row invalid, metrics 0, never NaN
    none = jax.tree.map(lambda a: a, traj).replace(turn_active=traj.turn_active.at[:, last].set(False))
    pairs = _TURN(none, jax.random.key(0), last)
    assert not np.asarray(pairs.drawn).any() and not np.asarray(pairs.valid).any()
    scores = jnp.zeros((5, 5))
    metrics, _ = mi_metrics(scores, scores, pairs.true_column, jnp.eye(5, dtype=bool), pairs.valid,
                            MIEmaState.create())
    assert all(float(v) == 0.0 for v in metrics.values())


def test_empty_reasoning_is_invalid():
    traj, _ = make(2)
    traj = traj.replace(reasoning_lengths=traj.reasoning_lengths.at[::2].set(0))
    for pairs in (_FIRST(traj, jax.random.key(3)), _TRAJ(traj, jax.random.key(3))):
        r = np.asarray(traj.reasoning_lengths)[np.asarray(pairs.rows), np.asarray(pairs.turns)]
        np.testing.assert_array_equal(np.asarray(pairs.valid), r > 0)
        assert (r == 0).any() and (r > 0).any()


def test_draws_are_uniform():
    """Trajectory pairs: each trajectory equally likely, then each of its played turns."""
    traj, rows = make(4)
    keys = jax.random.split(jax.random.key(5), 3000)
    draws = jax.jit(jax.vmap(lambda k: P.trajectory_pairs(traj, k, 1)))(keys)
    b, t = np.asarray(draws.rows[:, 0]), np.asarray(draws.turns[:, 0])
    counts = np.bincount(b, minlength=BATCH)
    assert np.all(np.abs(counts / len(keys) - 1 / BATCH) < 0.03)
    for row in range(BATCH):
        played = len(rows[row])
        turn_counts = np.bincount(t[b == row], minlength=TURNS)
        assert turn_counts[played:].sum() == 0
        freq = turn_counts[:played] / max(turn_counts.sum(), 1)
        assert np.all(np.abs(freq - 1 / played) < 0.2), (row, freq)
    first = jax.jit(jax.vmap(lambda k: P.first_turn_pairs(traj, k, 2, SIZE).rows))(keys)
    first = np.asarray(first)
    assert np.all(first[:, 0] != first[:, 1])
    assert np.all(np.abs(np.bincount(first.ravel(), minlength=BATCH) / first.size - 1 / BATCH) < 0.03)


def test_pairs_of_a_real_rollout_decode_to_the_turn_text():
    """The layout contract with `rollout`: x ends with `<think>`, z is the text before
    `</think>`, a starts at it. A scripted policy writes known text each turn."""
    from ragen_jax.envs import registry
    from ragen_jax.models import hf, sampling
    from ragen_jax.rollout.play import RolloutConfig, rollout
    from ragen_jax.rollout.policies import Policy
    from ragen_jax.text.codec import TextCodec
    from ragen_jax.text.prompt import PromptTemplate

    config = RolloutConfig(num_groups=2, group_size=2, max_turns=2, max_actions_per_turn=1, max_new_tokens=20)
    env, params = registry.make("SimpleSokoban")
    tok = hf.load_tokenizer()
    codec, prompt = TextCodec.build(tok, env, 1), PromptTemplate.build(tok, env, 1)
    texts = [[f" row {b} turn {t} plan</think> <answer> Up </answer>" for t in range(2)] for b in range(4)]
    ids = [[tok.encode(text, add_special_tokens=False) for text in row] for row in texts]
    script = np.zeros((4, 2, 20), np.int32)
    lengths = np.array([[len(i) for i in row] for row in ids], np.int32)
    for b in range(4):
        for t in range(2):
            script[b, t, : lengths[b, t]] = ids[b][t]

    class Scripted(Policy):
        def init_cache(self, batch, length):
            return jnp.zeros(())

        def prefill(self, cache, tokens, mask, offset, prev_logits):
            return cache, jnp.zeros((tokens.shape[0], 1)) if prev_logits is None else prev_logits

        def decode(self, cache, logits, offset, key, done, turn):
            n = jnp.where(done, 0, jnp.asarray(lengths)[:, turn])
            out = jnp.where(jnp.arange(20) < n[:, None], jnp.asarray(script)[:, turn], 0)
            return cache, sampling.DecodeOutput(tokens=out, logprobs=jnp.zeros(out.shape), lengths=n, done=done,
                                                logits=logits)

    traj = jax.jit(lambda k: rollout(k, Scripted(), env, params, codec, prompt, config))(jax.random.key(0))
    for pairs in (P.trajectory_pairs(traj, jax.random.key(1), 4), P.turn_pairs(traj, jax.random.key(1), 1, 4)):
        check_decoded(tok, traj, pairs)


def check_decoded(tok, traj, pairs):
    x_ids, x_mask = P.prompts(traj, pairs)
    s = P.samples(traj, pairs, 6)
    for j, (b, t) in enumerate(zip(np.asarray(pairs.rows), np.asarray(pairs.turns))):
        assert bool(pairs.valid[j])
        x = tok.decode(np.asarray(x_ids[j])[np.asarray(x_mask[j])])
        assert x.endswith("<|im_start|>assistant\n<think>") and x.count("assistant\n<think>") == t + 1
        assert all(f" row {b} turn {earlier} plan</think>" in x for earlier in range(t))
        assert tok.decode(np.asarray(s.tokens[j])[np.asarray(s.reasoning_mask[j])]) == f" row {b} turn {t} plan"
        answer = tok.decode(np.asarray(s.answer[j])[np.asarray(s.answer_only_mask[j])])
        assert answer.startswith("</think>") and "</think> <answer> Up </answer>".startswith(answer)

"""`diagnose` end to end: known cases (a template model vs a trained board-copying model),
the shared-prefill scores against `cross_score` and naive forwards, config and outputs."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ragen_jax.diagnostics import pairs as P
from ragen_jax.diagnostics.buffer_scoring import Scoring, mean_and_sum, span_choice, span_widths
from ragen_jax.diagnostics.cross_scoring import cross_score
from ragen_jax.diagnostics.diagnose import (DiagnosticsConfig, DiagnosticsState, _score, action_reasoning_scores,
                                            buffer_cache, diagnose)
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.head import token_logprobs

from diag_synthetic import build, random_rows

# A toy board game in token ids: the observation is [turn, 4 board cells, <think>]; the agent
# writes [board copy, note, </think>, note + 10, end]: z = copy + note, a = [</think>, answer, end].
SYSTEM, THINK, CLOSE, END = (5, 6, 7), 30, 31, 32
CELLS, NOTES = (20, 26), (40, 44)
GROUPS, SIZE, OBS, GEN, Z = 4, 4, 7, 9, 5
CFG = DecoderConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                  rope_theta=10_000.0, max_position_embeddings=512)
CONFIG = DiagnosticsConfig(num_samples=GROUPS * SIZE, per_turn_samples=8, answer_tokens=4)
PREFIXES = ("first_turn", "trajectory", "turn0", "turn1", "action_state", "action_reasoning")


def turn(t, board, note):
    return [10 + t, *board], [*board, note, CLOSE, note + 10, END]


def game_rows(seed):
    """4 groups with distinct first boards; every member writes its own note; the last member
    of each group stops after the first turn."""
    rng = np.random.default_rng(seed)
    boards = set()
    while len(boards) < GROUPS:
        boards.add(tuple(rng.integers(*CELLS, 4)))
    rows = []
    for board in sorted(boards):
        for member in range(SIZE):
            row = []
            for t in range(1 if member == SIZE - 1 else 2):
                obs, gen = turn(t, board if t == 0 else rng.integers(*CELLS, 4), int(rng.integers(*NOTES)))
                row.append((np.array(obs + [THINK]), np.array(gen), Z))
            rows.append(row)
    return rows


def training_batch(key, n):
    """Two-turn games as contiguous sequences, loss on the generated tokens."""
    k_board, k_note = jax.random.split(key)
    boards = jax.random.randint(k_board, (n, 2, 4), *CELLS)
    notes = jax.random.randint(k_note, (n, 2, 1), *NOTES)
    parts, loss = [jnp.broadcast_to(jnp.array(SYSTEM), (n, 3))], [jnp.zeros((n, 3))]
    for t in range(2):
        fill = lambda v: jnp.full((n, 1), v)
        parts += [fill(10 + t), boards[:, t], fill(THINK), boards[:, t], notes[:, t], fill(CLOSE), notes[:, t] + 10,
                  fill(END)]
        loss += [jnp.zeros((n, 6)), jnp.ones((n, 8))]
    return jnp.concatenate(parts, 1), jnp.concatenate(loss, 1)


@pytest.fixture(scope="module")
def traj():
    return build(np.array(SYSTEM), game_rows(0), OBS, GEN)


@pytest.fixture(scope="module")
def copy_model():
    """Trained until it copies the board into its reasoning and answers from its note."""
    graph, params = nnx.split(init_model(CFG, jax.random.key(7)))
    opt = optax.adam(3e-3)

    def loss_fn(params, tokens, weight):
        model = nnx.merge(graph, params)
        mask = jnp.ones_like(tokens, bool)
        hidden, _ = model(tokens, positions_from_mask(mask), mask)
        logp = token_logprobs(model, hidden[:, :-1], tokens[:, 1:])
        return -jnp.sum(logp * weight[:, 1:]) / weight[:, 1:].sum()

    @jax.jit
    def train(params, opt_state, key):
        def step(carry, key):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *training_batch(key, 64))
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), jax.random.split(key, 120))
        return params, opt_state, losses

    # the only uncertainty left is the note (uniform over 4): 2 × log 4 per 16 scored tokens.
    # Train in rounds of 120 steps until the loss gets there: how many rounds it takes depends
    # on the XLA/optax version's rounding, not on what the tests check.
    target, opt_state = 2 * math.log(4) / 16 + 0.05, opt.init(params)
    for round_key in jax.random.split(jax.random.key(0), 8):
        params, opt_state, losses = train(params, opt_state, round_key)
        if float(losses[-20:].mean()) < target:
            break
    assert float(losses[-20:].mean()) < target, float(losses[-20:].mean())
    return nnx.merge(graph, params)


@pytest.fixture(scope="module")
def template_model():
    """Every attention output zeroed: each token's distribution depends on that token alone."""
    model = init_model(CFG, jax.random.key(8))
    for layer in model.layers:
        layer.self_attn.o_proj.kernel[...] = jnp.zeros_like(layer.self_attn.o_proj.kernel[...])
    return model


_DIAGNOSE = jax.jit(diagnose, static_argnames=("config", "group_size"))


@pytest.fixture(scope="module")
def results(traj, copy_model, template_model):
    state = DiagnosticsState.create()
    template, _ = _DIAGNOSE(template_model, traj, jax.random.key(1), CONFIG, state, group_size=SIZE)
    copy1, state1 = _DIAGNOSE(copy_model, traj, jax.random.key(1), CONFIG, state, group_size=SIZE)
    copy2, state2 = _DIAGNOSE(copy_model, traj, jax.random.key(2), CONFIG, state1, group_size=SIZE)
    as_float = lambda m: {k: float(v) for k, v in m.items()}
    return as_float(template), as_float(copy1), as_float(copy2), (state, state1, state2), copy1


def test_template_model_has_no_mi(results):
    template = results[0]
    # (action_reasoning is left out: the answer's first token, `</think>`, is predicted from the
    # last token of the swapped-in reasoning, which even a token-by-token model reads)
    for prefix in PREFIXES[:-1]:
        assert abs(template[f"mi/{prefix}/mi_estimate"]) < 1e-5, prefix
        assert abs(template[f"mi/{prefix}/mi_seq_estimate"]) < 1e-4, prefix
    # constant rows: the tie goes to column 0, so exactly group 0's samples are retrieved
    assert template["mi/first_turn/retrieval_acc"] == pytest.approx(1 / GROUPS)
    assert template["mi/first_turn/retrieval_above_chance"] == pytest.approx(0.0, abs=1e-6)
    assert abs(template["mi/trajectory/retrieval_above_chance"]) <= 1 / (GROUPS * SIZE) + 1e-6
    assert template["mi/first_turn/valid_thinking_rate"] == 1.0


def test_board_copying_model_has_high_mi(results):
    template, copy = results[0], results[1]
    log_groups = math.log(GROUPS)
    assert copy["mi/first_turn/mi_estimate"] > 0.8 * log_groups
    assert copy["mi/first_turn/retrieval_acc"] >= 0.9
    assert copy["mi/first_turn/retrieval_above_chance"] > 0.6
    assert copy["mi/trajectory/mi_estimate"] > 1.0 and copy["mi/trajectory/retrieval_acc"] >= 0.9
    assert copy["mi/turn1/mi_estimate"] > 0.8 * math.log(8) and copy["mi/turn1/retrieval_acc"] >= 0.9
    assert copy["mi/turn0/mi_estimate"] > 0.5 and copy["mi/turn0/retrieval_above_chance"] > 0.3
    assert copy["mi/turn1/valid_samples"] == 8 and copy["mi/turn0/valid_samples"] == 8
    # its answer follows the note in its reasoning, not the board: swapping the reasoning for a
    # group-mate's changes the answer, swapping the state under the same reasoning does not
    assert copy["mi/action_reasoning/mi_seq_estimate"] > 0.3
    assert copy["mi/action_reasoning/retrieval_above_chance"] > 0.2
    assert copy["mi/action_state/mi_seq_estimate"] < 0.1
    assert copy["mi/first_turn/mi_zscore_ema"] > template["mi/first_turn/mi_zscore_ema"] + 1.0
    assert copy["mi/reasoning_length_mean"] == Z and copy["mi/first_turn/reasoning_length_mean"] == Z


def test_outputs_and_state(results):
    _, copy1, copy2, (state0, state1, state2), raw = results
    assert all(v.shape == () and v.dtype == jnp.float32 for v in raw.values())
    assert all(math.isfinite(v) for v in copy1.values())
    expected = {f"mi/{p}/mi_estimate" for p in PREFIXES} | {
        "mi/first_turn/mi_zscore_ema", "mi/trajectory/mi_zscore_ema_seq", "mi/first_turn/retrieval_acc@8",
        "mi/first_turn/reasoning_token_entropy", "mi/trajectory/reasoning_token_entropy", "mi/collapse_alarm",
        "mi/collapse_peak", "mi/reasoning_length_mean"}
    assert expected <= set(copy1)
    assert not bool(state0.first_turn.initialised)
    assert bool(state1.first_turn.initialised) and bool(state1.trajectory.initialised)
    # every trajectory is a first-turn sample here (same set, same std): only the trajectory
    # samples' turns differ between the two keys
    assert float(state2.first_turn.std_marginal) == pytest.approx(float(state1.first_turn.std_marginal))
    assert float(state2.trajectory.std_marginal) != float(state1.trajectory.std_marginal)
    assert bool(state1.collapse.seen) and float(state1.collapse.peak) == copy1["mi/first_turn/mi_zscore_ema"]
    assert copy1["mi/collapse_alarm"] == 0.0
    # a copy model's reasoning is peaked: low but nonzero token entropy
    assert 0.0 < copy1["mi/first_turn/reasoning_token_entropy"] < 1.0


def test_the_alarm_floor_reaches_the_alarm(traj, template_model, results):
    """After the board-copying model's steps, the template model's step raises the alarm under
    the default floor (the copy's MI-ZScore-EMA peak is far above 1) and stays quiet under a
    floor above that peak: `diagnostics.alarm_floor` is what the jitted alarm uses."""
    _, _, copy2, (_, _, state2), _ = results
    peak = copy2["mi/collapse_peak"]
    assert peak > CONFIG.alarm_floor == 1.0
    alarmed, _ = _DIAGNOSE(template_model, traj, jax.random.key(3), CONFIG, state2, group_size=SIZE)
    assert float(alarmed["mi/collapse_alarm"]) == 1.0
    higher = dataclasses.replace(CONFIG, alarm_floor=peak + 1.0)
    quiet, _ = _DIAGNOSE(template_model, traj, jax.random.key(3), higher, state2, group_size=SIZE)
    assert float(quiet["mi/collapse_alarm"]) == 0.0 and float(quiet["mi/collapse_peak"]) == peak


def test_a_data_mesh_scores_rows_per_device_with_the_same_metrics(traj, copy_model, results):
    """On a mesh that splits only `data`, every device prefills and scores its own rows
    (sharding.per_device_rows; 8 devices: 2 rows each, one per-turn sample each): the metrics of
    one device, up to float rounding."""
    from ragen_jax.core import sharding

    mesh = sharding.make_mesh((8, 1, 1))
    _, want, _, (state, _, _), _ = results
    placed = jax.device_put(traj, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(sharding.ROWS)))
    diagnose_on_mesh = jax.jit(diagnose, static_argnames=("config", "group_size", "mesh"))
    got, _ = diagnose_on_mesh(copy_model, placed, jax.random.key(1), CONFIG, state, group_size=SIZE, mesh=mesh)
    assert set(got) == set(want)
    for name, value in got.items():
        assert float(value) == pytest.approx(want[name], rel=1e-4, abs=1e-5), name


def test_scoring_a_few_samples_at_a_time_gives_the_same_metrics(traj, copy_model, results):
    """`score_rows` (3: not a divisor of any set's rows, so the last block is padded) scores
    the samples in blocks: the metrics of scoring them all at once, up to float rounding."""
    _, want, _, (state, _, _), _ = results
    blocked = dataclasses.replace(CONFIG, score_rows=3)
    run = jax.jit(diagnose, static_argnames=("config", "group_size"))
    got, _ = run(copy_model, traj, jax.random.key(1), blocked, state, group_size=SIZE)
    assert set(got) == set(want)
    for name, value in got.items():
        assert float(value) == pytest.approx(want[name], rel=1e-4, abs=1e-5), name


def test_switches_drop_their_metrics(traj, template_model):
    config = dataclasses.replace(CONFIG, per_turn=False, action_grounding=False)
    shapes, _ = jax.eval_shape(lambda m, t: diagnose(m, t, jax.random.key(0), config, DiagnosticsState.create(),
                                                     group_size=SIZE), template_model, traj)
    assert not any(k.startswith(("mi/turn", "mi/action")) for k in shapes)
    assert "mi/first_turn/mi_estimate" in shapes and "mi/collapse_alarm" in shapes


@pytest.mark.parametrize("field, value", [("compute_freq", 0), ("num_samples", -1), ("per_turn_samples", 1.5),
                                          ("answer_tokens", 0), ("prefill_rows", 0), ("score_rows", -1),
                                          ("span_buckets", 0), ("span_buckets", 2.0),
                                          ("score_rows", 2.0), ("per_turn", 1),
                                          ("action_grounding", "yes"), ("alarm_drop", 0.0), ("alarm_drop", 1.5),
                                          ("alarm_entropy_tolerance", -0.1),
                                          ("alarm_entropy_tolerance", float("nan")), ("alarm_below", -1.0),
                                          ("alarm_below", float("inf")), ("alarm_below", True),
                                          ("alarm_floor", -0.5), ("alarm_floor", float("nan")),
                                          ("alarm_floor", False)])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"diagnostics\.{field}="):
        DiagnosticsConfig(**{field: value})


# --------------------------------------------------------------- scores against references


@pytest.fixture(scope="module")
def random_case():
    """Random text with holes, short and empty reasoning, unplayed turns; a random model."""
    rng = np.random.default_rng(3)
    rows = random_rows(rng, 3, 3, 3, 5, 6, vocab=(3, 64))
    rows[0] += [(rng.integers(3, 64, 2), rng.integers(3, 64, 4), 2)] * (3 - len(rows[0]))
    traj = build(rng.integers(3, 64, 4), rows, 5, 6)
    model = init_model(CFG, jax.random.key(4))
    return traj, model, jax.jit(buffer_cache)(model, traj)


def test_shared_prefill_scores_equal_cross_score(random_case):
    traj, model, (cache, tokens) = random_case
    answer_tokens = 3

    @jax.jit
    def both(pairs):
        s = P.samples(traj, pairs, answer_tokens)
        logp, _ = _score(model, cache, tokens, traj, pairs, s.tokens, s.reasoning_mask | s.answer_mask)
        ours = (*mean_and_sum(logp, s.reasoning_mask), mean_and_sum(logp, s.answer_mask)[1])
        ids, mask = P.prompts(traj, pairs)
        ref_z = cross_score(model, ids, mask, s.tokens, s.reasoning_mask)
        ref_za = cross_score(model, ids, mask, s.tokens, s.reasoning_mask | s.answer_mask)[1]
        return ours, (*ref_z, ref_za - ref_z[1])

    for pairs in (P.first_turn_pairs(traj, jax.random.key(0), 6, 3), P.trajectory_pairs(traj, jax.random.key(1), 6),
                  P.turn_pairs(traj, jax.random.key(2), 2, 6)):
        ours, ref = both(pairs)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


def test_span_widths_and_the_narrowest_that_holds_every_row():
    assert span_widths(6, 3) == (2, 4, 6) and span_widths(5, 2) == (3, 5) and span_widths(3, 8) == (1, 2, 3)
    assert span_widths(7, 1) == (7,)
    rng, widths = np.random.default_rng(0), (2, 4, 6)
    choose = jax.jit(span_choice, static_argnums=1)
    for _ in range(40):
        lengths = rng.integers(0, 7, rng.integers(1, 5))
        used = int(lengths.max())
        want = next(i for i, w in enumerate(widths) if w >= used)
        assert int(choose(jnp.asarray(np.arange(6)[None, :] < lengths[:, None]), widths)) == want, lengths


def test_scoring_only_the_spans_read_equals_the_full_width(random_case):
    """span_buckets 3 (widths 2, 4, 6 of 6), one sample per block: each sample is scored only
    as wide as its reasoning and answer reach; the full width's log-probs and entropies up to
    float rounding, and 0 after them."""
    traj, model, (cache, tokens) = random_case
    narrow = Scoring(block_rows=1, span_buckets=3)

    @jax.jit
    def both(pairs):
        s = P.samples(traj, pairs, 3)
        mask = s.reasoning_mask | s.answer_mask
        full = _score(model, cache, tokens, traj, pairs, s.tokens, mask, own=True)
        return full, _score(model, cache, tokens, traj, pairs, s.tokens, mask, own=True, scoring=narrow), mask

    chosen = set()
    for pairs in (P.first_turn_pairs(traj, jax.random.key(0), 6, 3), P.trajectory_pairs(traj, jax.random.key(1), 6)):
        (logp, entropy), (logp_n, entropy_n), mask = both(pairs)
        np.testing.assert_allclose(np.asarray(logp_n), np.asarray(logp), atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(entropy_n), np.asarray(entropy), atol=2e-5, rtol=1e-5)
        chosen |= {int(span_choice(row[None], (2, 4, 6))) for row in np.asarray(mask)}
    assert len(chosen) > 1, chosen  # the samples took more than one width


def test_action_reasoning_scores_equal_naive_forward(random_case):
    traj, model, (cache, tokens) = random_case
    answer_tokens, size, width = 3, 3, 32
    scores, sums, valid, equivalent = jax.jit(action_reasoning_scores, static_argnums=(4, 5))(
        model, cache, tokens, traj, size, answer_tokens)

    @jax.jit
    def forward(ids, mask):
        hidden, _ = model(ids, positions_from_mask(mask), mask)
        return token_logprobs(model, hidden[:, :-1], ids[:, 1:])[0]

    buf, keep = np.asarray(traj.tokens), np.asarray(traj.mask)
    r, g, active = (np.asarray(a)[:, 0] for a in (traj.reasoning_lengths, traj.gen_lengths, traj.turn_active))
    off = traj.layout.generation_offsets[0]
    checked = 0
    for i in range(buf.shape[0]):
        answer = buf[i, off + r[i] : off + min(g[i], r[i] + answer_tokens)]
        assert bool(valid[i]) == (active[i] and r[i] > 0 and len(answer) > 0)
        for c in range(size):
            k = i // size * size + c
            x = buf[k, :off][keep[k, :off]]
            seq = np.concatenate([x, buf[k, off : off + r[k]], answer])
            if len(answer) == 0:
                assert float(sums[i, c]) == 0.0
                continue
            ids = np.zeros((1, width), np.int32)
            ids[0, : len(seq)] = seq
            logp = np.asarray(forward(jnp.asarray(ids), jnp.asarray(np.arange(width) < len(seq))[None]))
            want = logp[len(seq) - len(answer) - 1 : len(seq) - 1].sum()
            np.testing.assert_allclose(float(sums[i, c]), want, atol=2e-5, rtol=1e-5)
            np.testing.assert_allclose(float(scores[i, c]), want / len(answer), atol=2e-5, rtol=1e-5)
            checked += 1
    assert checked > 10
    # identical reasoning texts are equivalent columns (each column with itself at least)
    assert np.asarray(equivalent)[:, np.arange(size), np.arange(size)].all()

"""MI proxies against a plain NumPy reading of
docs/method.md#mi-estimates-retrieval-and-entropies, plus the known limiting cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.diagnostics.mi import MIEmaState, equivalent_columns, mi_metrics, reasoning_stats

M, N = 12, 6


def logsumexp(row):
    top = max(row)
    return top + math.log(sum(math.exp(v - top) for v in row))


def reference(L, Ls, col, equiv, valid, ema):
    """docs/method.md#mi-estimates-retrieval-and-entropies with Python loops.
    ema = (std, std_seq, initialised)."""
    rows = [i for i in range(len(L)) if valid[i]]
    if not rows:
        return None, ema
    out = {}
    per = {}
    for name, S in (("", L), ("_seq", Ls)):
        matched = [S[i][col[i]] for i in rows]
        marginal = [logsumexp(S[i]) - math.log(N) for i in rows]
        per[name] = (matched, marginal, float(np.std(marginal)))
    std, std_seq, initialised = ema
    std = 0.9 * std + 0.1 * per[""][2] if initialised else per[""][2]
    std_seq = 0.9 * std_seq + 0.1 * per["_seq"][2] if initialised else per["_seq"][2]
    m, g = per[""][0], per[""][1]
    ms, gs = per["_seq"][0], per["_seq"][1]
    out["mi_estimate"] = np.mean([a - b for a, b in zip(m, g)])
    out["mi_seq_estimate"] = np.mean([a - b for a, b in zip(ms, gs)])
    out["conditional_entropy_est"] = -np.mean(m)
    out["reasoning_entropy_est"] = -np.mean(g)
    out["mi_zscore"] = np.mean([(a - b) / (per[""][2] + 1e-3) for a, b in zip(m, g)])
    out["mi_zscore_seq"] = np.mean([(a - b) / (per["_seq"][2] + 1e-3) for a, b in zip(ms, gs)])
    out["mi_zscore_ema"] = np.mean([(a - b) / (std + 1e-3) for a, b in zip(m, g)])
    out["mi_zscore_ema_seq"] = np.mean([(a - b) / (std_seq + 1e-3) for a, b in zip(ms, gs)])
    out["valid_thinking_rate"] = len(rows) / len(L)
    chance = np.mean([sum(equiv[col[i]][j] for j in range(N)) / N for i in rows])
    for k in (1, 2, 4, 8):
        hits = []
        for i in rows:
            order = sorted(range(N), key=lambda j: (-L[i][j], j))[:k]
            hits.append(any(equiv[col[i]][j] for j in order))
        suffix = "" if k == 1 else f"@{k}"
        out[f"retrieval_acc{suffix}"] = np.mean(hits)
        out[f"retrieval_chance{suffix}"] = min(1.0, chance * k)
    out["retrieval_above_chance"] = out["retrieval_acc"] - out["retrieval_chance"]
    return out, (std, std_seq, True)


_METRICS = jax.jit(mi_metrics)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    duplicate_prompts=st.booleans(),
    coarse=st.booleans(),
    initialised=st.booleans(),
)
def test_metrics_match_numpy_reference(seed, duplicate_prompts, coarse, initialised):
    rng = np.random.default_rng(seed)
    L = rng.normal(-2, 1, size=(M, N))
    if coarse:  # ties between columns
        L = np.round(L)
    Ls = L * rng.integers(1, 20, size=(M, 1))
    col = rng.integers(0, N, size=M)
    prompts = rng.integers(0, 3 if duplicate_prompts else 1000, size=(N, 2))
    prompt_mask = np.ones_like(prompts, bool)
    equiv = np.asarray(equivalent_columns(jnp.asarray(prompts), jnp.asarray(prompt_mask)))
    assert np.array_equal(equiv, (prompts[:, None, :] == prompts[None, :, :]).all(-1))
    valid = rng.random(M) < 0.8
    ema = (float(rng.random()), float(rng.random()), initialised)
    state = MIEmaState(jnp.float32(ema[0]), jnp.float32(ema[1]), jnp.bool_(initialised))
    got, new_state = _METRICS(
        jnp.asarray(L, jnp.float32), jnp.asarray(Ls, jnp.float32), jnp.asarray(col), jnp.asarray(equiv),
        jnp.asarray(valid), state,
    )
    want, want_ema = reference(L.astype(np.float32).astype(float).tolist(), Ls.astype(np.float32).astype(float).tolist(), col, equiv, valid, ema)
    if want is None:
        assert all(float(v) == 0.0 for v in got.values())
        assert bool(new_state.initialised) == initialised
        return
    for name, value in want.items():
        np.testing.assert_allclose(float(got[name]), value, rtol=2e-4, atol=2e-4, err_msg=name)
    np.testing.assert_allclose([float(new_state.std_marginal), float(new_state.std_marginal_seq)], want_ema[:2], rtol=1e-4)
    assert bool(new_state.initialised)


def test_input_specific_matrix_reaches_log_n_and_perfect_retrieval():
    L = np.full((N, N), -1000.0)
    np.fill_diagonal(L, -1.0)
    equiv = np.eye(N, dtype=bool)
    got, _ = mi_metrics(jnp.asarray(L), jnp.asarray(L), jnp.arange(N), jnp.asarray(equiv), jnp.ones(N, bool), MIEmaState.create())
    np.testing.assert_allclose(float(got["mi_estimate"]), math.log(N), rtol=1e-5)
    assert float(got["retrieval_acc"]) == 1.0
    np.testing.assert_allclose(float(got["retrieval_chance"]), 1 / N, rtol=1e-6)


def test_template_rows_give_zero_mi_and_chance_retrieval():
    rng = np.random.default_rng(0)
    L = np.repeat(rng.normal(size=(N * 4, 1)), N, axis=1)  # every column scores a row alike
    col = np.tile(np.arange(N), 4)
    got, _ = mi_metrics(jnp.asarray(L), jnp.asarray(L), jnp.asarray(col), jnp.eye(N, dtype=bool), jnp.ones(N * 4, bool), MIEmaState.create())
    assert abs(float(got["mi_estimate"])) < 1e-5 and abs(float(got["mi_zscore"])) < 1e-2
    # Constant rows: argmax is column 0, so exactly the rows whose true column is 0 hit (= chance).
    np.testing.assert_allclose(float(got["retrieval_acc"]), 1 / N, rtol=1e-6)
    assert abs(float(got["retrieval_above_chance"])) < 1e-6


def test_ema_is_initialised_by_first_value_then_blended():
    L = jnp.asarray(np.random.default_rng(1).normal(size=(M, N)), jnp.float32)
    args = (L, L, jnp.zeros(M, jnp.int32), jnp.eye(N, dtype=bool), jnp.ones(M, bool))
    _, first = mi_metrics(*args, MIEmaState.create())
    marginal = np.asarray(jax.nn.logsumexp(L, axis=1)) - math.log(N)
    np.testing.assert_allclose(float(first.std_marginal), marginal.std(), rtol=1e-5)
    _, second = mi_metrics(*args, first.replace(std_marginal=jnp.float32(2.0)))
    np.testing.assert_allclose(float(second.std_marginal), 0.9 * 2.0 + 0.1 * marginal.std(), rtol=1e-5)


def test_reasoning_stats():
    entropy = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
    got = reasoning_stats(entropy, mask)
    assert float(got["reasoning_token_entropy"]) == 2.0 and float(got["reasoning_length_mean"]) == 1.5

"""The collapse alarm against a plain Python loop over the same sequence of diagnostic steps."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.diagnostics.collapse import AlarmLog, CollapseState, collapse_warning, update
from ragen_jax.diagnostics.diagnose import DiagnosticsConfig

f32 = np.float32


def reference(steps, drop, tolerance, below=np.inf, floor=0.0):
    """docs/method.md#the-collapse-alarm read literally: alarm when MI-ZScore-EMA is at least
    `drop` of its running peak below that peak while the entropy is within `tolerance`
    (relative) of its value at the peak (and, when an absolute level `below` is given,
    MI-ZScore-EMA is under it), once MI-ZScore-EMA has reached `floor` at some step."""
    peak = entropy_at_peak = None
    reached = False
    alarms = []
    for mi, entropy, observed in steps:
        mi, entropy = f32(mi), f32(entropy)
        if not observed:
            alarms.append(False)
            continue
        if peak is None or mi > peak:
            peak, entropy_at_peak = mi, entropy
        reached = reached or mi >= f32(floor)
        fell = peak > 0 and reached and mi <= (f32(1) - f32(drop)) * peak
        flat = entropy >= (f32(1) - f32(tolerance)) * entropy_at_peak
        alarms.append(bool(fell and flat and mi < f32(below)))
    return alarms


@jax.jit
def run(mi, entropy, observed, drop, tolerance, below=np.inf, floor=0.0):
    def step(state, x):
        mi_t, entropy_t, observed_t = x
        return update(state, mi_t, entropy_t, drop, tolerance, observed=observed_t, below=below, floor=floor)

    return jax.lax.scan(step, CollapseState.create(), (mi, entropy, observed))


# XLA on CPU flushes float32 subnormals to zero (a 3e-44 peak is 0 there, > 0 in NumPy), so
# MI and entropy values are kept at three decimals: zero or far from the subnormal range,
# and so are their products with (1 - drop) and (1 - tolerance)
values = st.floats(-3, 6, allow_nan=False).map(lambda x: round(x, 3))
steps = st.lists(st.tuples(values, st.floats(0, 5).map(lambda x: round(x, 3)), st.booleans()),
                 min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(steps=steps, drop=st.floats(1 / 64, 1.0, width=32),
       tolerance=st.floats(0.0, 1.0, width=32),
       below=st.one_of(st.just(np.inf), st.floats(-1, 6).map(lambda x: round(x, 3))),
       floor=st.one_of(st.just(0.0), st.floats(0, 6).map(lambda x: round(x, 3))))
def test_alarm_matches_python_loop(steps, drop, tolerance, below, floor):
    pad = 12 - len(steps)  # one compiled shape: unobserved padding at the end changes nothing
    mi, entropy, observed = (np.array([s[k] for s in steps] + [0] * pad) for k in range(3))
    _, alarms = run(jnp.asarray(mi, jnp.float32), jnp.asarray(entropy, jnp.float32),
                    jnp.asarray(observed, bool), f32(drop), f32(tolerance), f32(below), f32(floor))
    assert np.asarray(alarms)[: len(steps)].tolist() == reference(steps, drop, tolerance, below, floor)
    assert not np.asarray(alarms)[len(steps):].any()


def test_known_cases():
    drop, tol = 0.5, 0.1
    # MI rises to a peak of 4, then falls to 1.5 with the entropy flat: alarm on the fall only
    mi = jnp.array([1.0, 4.0, 3.0, 1.5, 1.5], jnp.float32)
    flat = jnp.full(5, 2.0, jnp.float32)
    state, alarms = run(mi, flat, jnp.ones(5, bool), drop, tol)
    assert np.asarray(alarms).tolist() == [False, False, False, True, True]
    assert float(state.peak) == 4.0 and float(state.entropy_at_peak) == 2.0
    # the same MI fall with the entropy falling too (ordinary convergence): no alarm
    falling = jnp.array([2.0, 2.0, 1.5, 1.0, 0.5], jnp.float32)
    _, alarms = run(mi, falling, jnp.ones(5, bool), drop, tol)
    assert not np.asarray(alarms).any()
    # never above zero: no alarm
    _, alarms = run(-mi, flat, jnp.ones(5, bool), drop, tol)
    assert not np.asarray(alarms).any()
    # an absolute level of 1.5: the fall to 1.5 is not below it; a level of 2 lets it alarm
    _, alarms = run(mi, flat, jnp.ones(5, bool), drop, tol, 1.5)
    assert not np.asarray(alarms).any()
    _, alarms = run(mi, flat, jnp.ones(5, bool), drop, tol, 2.0)
    assert np.asarray(alarms).tolist() == [False, False, False, True, True]


def test_the_floor_keeps_a_peak_of_noise_quiet():
    """A real LM's MI-ZScore-EMA (±0.01, docs/results.md) that peaks and halves never alarms under
    the default floor of 1; the same shape 1000× larger (a grounded peak of 12) alarms at the
    same steps as with no floor; a floor of 0 is the relative rule exactly; and the floor holds
    in a run resumed from a checkpoint of the state."""
    drop, tol, floor = 0.5, 0.1, DiagnosticsConfig().alarm_floor
    assert floor == 1.0
    grounded = jnp.array([6.0, 12.0, 9.0, 5.0, -1.0, 4.0, 2.0, 3.0], jnp.float32)
    noise = grounded / 1000
    flat, seen = jnp.full(8, 0.4, jnp.float32), jnp.ones(8, bool)
    relative = [False, False, False, True, True, True, True, True]  # at or under 6 after the peak of 12

    for mi in (noise, grounded):
        _, alarms = run(mi, flat, seen, drop, tol)
        assert np.asarray(alarms).tolist() == relative
        _, alarms = run(mi, flat, seen, drop, tol, np.inf, 0.0)
        assert np.asarray(alarms).tolist() == relative
    _, alarms = run(noise, flat, seen, drop, tol, np.inf, floor)
    assert not np.asarray(alarms).any()
    _, alarms = run(grounded, flat, seen, drop, tol, np.inf, floor)
    assert np.asarray(alarms).tolist() == relative
    # the floor is met by the peak itself (12 >= 12), and missed just above it
    _, alarms = run(grounded, flat, seen, drop, tol, np.inf, 12.0)
    assert np.asarray(alarms).tolist() == relative
    _, alarms = run(grounded, flat, seen, drop, tol, np.inf, 12.5)
    assert not np.asarray(alarms).any()

    # a resume: the state after 4 steps, restored from host arrays, remembers in its peak that
    # the floor was reached, so later values in the noise still alarm
    state, _ = run(grounded[:4], flat[:4], seen[:4], drop, tol, np.inf, floor)
    restored = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), state)
    scan = jax.jit(lambda state, mi, entropy: jax.lax.scan(
        lambda s, x: update(s, x[0], x[1], drop, tol, floor=floor), state, (mi, entropy)))
    _, alarms = scan(restored, grounded[4:], flat[4:])
    assert np.asarray(alarms).tolist() == relative[4:]
    _, alarms = scan(restored, noise[4:], flat[4:])
    assert np.asarray(alarms).all()


def test_warning_text():
    assert collapse_warning({"mi/collapse_alarm": np.float32(0)}) is None
    assert collapse_warning({"mi/collapse_alarm": np.float32(np.nan)}) is None
    assert collapse_warning({}) is None
    message = collapse_warning({"mi/collapse_alarm": 1.0, "mi/first_turn/mi_zscore_ema": 0.5,
                                "mi/collapse_peak": 2.0, "mi/first_turn/reasoning_token_entropy": 1.2})
    assert "collapse" in message and "0.500" in message and "2.000" in message
    assert "first-turn reasoning's token entropy (mi/first_turn/reasoning_token_entropy) stays at 1.200" in message


def test_alarm_log_warns_when_the_alarm_starts_notes_when_it_clears_and_counts():
    """One line per change of the alarm, not one per step under it; steps without diagnostics
    and steps with no reasoning to read change nothing; a resume rebuilds the counts."""
    alarm = lambda on: {"mi/collapse_alarm": float(on), "mi/first_turn/mi_zscore_ema": 0.5,
                        "mi/collapse_peak": 2.0, "mi/first_turn/reasoning_token_entropy": 1.2}
    unread = {**alarm(False), "mi/first_turn/valid_thinking_rate": 0.0}
    steps = [(1, alarm(0)), (2, {}), (5, alarm(1)), (6, {"mi/collapse_alarm": np.nan}), (10, alarm(1)),
             (15, unread), (20, alarm(0)), (25, alarm(1))]
    log = AlarmLog()
    lines = {step: log.update(step, m) for step, m in steps}
    assert lines[5] == collapse_warning(alarm(1)) and lines[25] == lines[5]
    assert lines[20] == "the collapse alarm cleared: MI-ZScore-EMA 0.500 (peak 2.000)"
    assert [s for s, line in lines.items() if line] == [5, 20, 25]
    assert log.summary() == "; collapse alarm on at 3 of 6 diagnostics steps (first at step 5)"
    assert AlarmLog().summary() == ""

    resumed = AlarmLog([{"step": s, **m} for s, m in steps[:5]])  # a run resumed at step 10, under alarm
    assert (resumed.alarmed, resumed.diagnosed, resumed.first) == (2, 3, 5)
    assert resumed.update(15, alarm(1)) == lines[5]  # the resumed run says once that the alarm is on
    assert resumed.update(20, alarm(1)) is None

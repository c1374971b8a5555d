"""The collapse alarm (docs/method.md#the-collapse-alarm): MI falls while entropy does not.

Template collapse is invisible to the usual entropy monitor: the reasoning stays as varied
token by token, it just stops depending on the input. So the alarm fires when MI-ZScore-EMA
has fallen by at least `drop_fraction` of its running peak while the token-level reasoning
entropy has not fallen by more than `entropy_tolerance` (relative) from its value at that peak:

    alarm = peak > 0  and  peak >= floor
            and  mi <= (1 - drop_fraction) * peak
            and  entropy >= (1 - entropy_tolerance) * entropy_at_peak
            and  mi < below

`floor` is a level the EMA must once have reached (default 0 here: the relative rule alone;
`diagnostics.alarm_floor`, 1 by default). A policy whose MI never rose (a real LM at ±0.01,
docs/results.md) has a peak that is itself noise, and half of it is noise too. The peak is a
running maximum, so `peak >= floor` stays true once reached, also in a run resumed from a
checkpoint: the state needs no new field.

`below` is an optional absolute level (default inf: the relative rule alone;
`diagnostics.alarm_below`, where 0 means no level). A long healthy
run can lose half of an early, very high peak and still read the input well (docs/results.md,
"The collapse signature": 20.9 → EMA 9.1 with retrieval 0.88, against ≈ 1 and retrieval 0.5 in a
real collapse);
`below` keeps such runs quiet.

A falling entropy alongside falling MI is ordinary convergence (the policy got sure of
itself), not an alarm. The peak and the entropy at it are updated *before* the test (a new
peak never alarms), and a non-positive peak never alarms (there is no fraction of it to lose).
Steps that are not `observed` (no valid reasoning sample) leave the state alone and never alarm.

On the host, `AlarmLog` turns the per-step alarm into one warning when it starts, a note when it
clears, and a count for the run's last line.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class CollapseState:
    """Running peak of MI-ZScore-EMA and the reasoning entropy measured at that peak."""

    peak: jax.Array  # f32
    entropy_at_peak: jax.Array  # f32
    seen: jax.Array  # bool: at least one observed step

    @classmethod
    def create(cls) -> "CollapseState":
        return cls(jnp.float32(0.0), jnp.float32(0.0), jnp.bool_(False))


def update(
    state: CollapseState,
    mi_zscore_ema,
    entropy,
    drop_fraction,
    entropy_tolerance,
    observed=True,
    below=jnp.inf,
    floor=0.0,
) -> tuple[CollapseState, jax.Array]:
    """Fold one diagnostic step in; returns (state, alarm: bool scalar). Pure jnp, jittable."""
    mi = jnp.asarray(mi_zscore_ema, jnp.float32)
    entropy = jnp.asarray(entropy, jnp.float32)
    observed = jnp.asarray(observed, bool)
    drop = jnp.asarray(drop_fraction, jnp.float32)
    tolerance = jnp.asarray(entropy_tolerance, jnp.float32)

    new_peak = ~state.seen | (mi > state.peak)
    peak = jnp.where(new_peak, mi, state.peak)
    entropy_at_peak = jnp.where(new_peak, entropy, state.entropy_at_peak)
    reached = (peak > 0) & (peak >= jnp.asarray(floor, jnp.float32))
    dropped = reached & (mi <= (1.0 - drop) * peak)
    flat = entropy >= (1.0 - tolerance) * entropy_at_peak
    alarm = observed & dropped & flat & (mi < jnp.asarray(below, jnp.float32))

    keep = lambda new, old: jnp.where(observed, new, old)
    state = CollapseState(
        peak=keep(peak, state.peak),
        entropy_at_peak=keep(entropy_at_peak, state.entropy_at_peak),
        seen=state.seen | observed,
    )
    return state, alarm


def collapse_warning(metrics: dict, prefix: str = "mi/") -> str | None:
    """For a host loop: the warning to log when a step's metrics raised the alarm, else None.
    The entropy it names is the alarm's: the policy's token entropy over the first turn's
    reasoning (not the update's entropy over every trained token, actor/entropy)."""
    alarm = metrics.get(f"{prefix}collapse_alarm")
    if alarm is None or not float(alarm) > 0:  # NaN (a step without diagnostics) is no alarm
        return None
    current = float(metrics.get(f"{prefix}first_turn/mi_zscore_ema", float("nan")))
    peak = float(metrics.get(f"{prefix}collapse_peak", float("nan")))
    entropy = float(metrics.get(f"{prefix}first_turn/reasoning_token_entropy", float("nan")))
    return (f"possible template collapse: MI-ZScore-EMA {current:.3f} fell from its peak {peak:.3f} "
            f"while the first-turn reasoning's token entropy ({prefix}first_turn/reasoning_token_entropy) stays "
            f"at {entropy:.3f}; the reasoning may no longer depend on the input")


class AlarmLog:
    """For a host loop: the alarm over a run's diagnostics steps, so that the warning is shown
    when the alarm starts (and a note when it clears) rather than at every step under it, and
    the run's last line can say how often it was on.

    `history` (the metrics.jsonl records of a resumed run) rebuilds the counts exactly; whether
    the alarm is on is not carried over, so a resumed run still under alarm warns once again."""

    def __init__(self, history: list[dict] = (), prefix: str = "mi/"):
        self.prefix = prefix
        self.on = False
        self.alarmed = self.diagnosed = 0
        self.first = None  # the first step under alarm
        for record in history:
            self.update(record["step"], record)
        self.on = False

    def update(self, step: int, metrics: dict) -> str | None:
        """Fold in one step's metrics; returns the line to show when the alarm starts or clears,
        else None. Steps without diagnostics (no or a NaN alarm) change nothing; a step with no
        first-turn reasoning to read (valid_thinking_rate 0) counts but neither raises nor clears it."""
        alarm = metrics.get(f"{self.prefix}collapse_alarm")
        if alarm is None or not math.isfinite(float(alarm)):
            return None
        self.diagnosed += 1
        if metrics.get(f"{self.prefix}first_turn/valid_thinking_rate", 1.0) == 0:
            return None
        was, self.on = self.on, float(alarm) > 0
        if self.on:
            self.alarmed += 1
            self.first = step if self.first is None else self.first
            return None if was else collapse_warning(metrics, self.prefix)
        if not was:
            return None
        current = float(metrics.get(f"{self.prefix}first_turn/mi_zscore_ema", float("nan")))
        peak = float(metrics.get(f"{self.prefix}collapse_peak", float("nan")))
        return f"the collapse alarm cleared: MI-ZScore-EMA {current:.3f} (peak {peak:.3f})"

    def summary(self) -> str:
        """'; collapse alarm on at K of M diagnostics steps (first at step S)', or '' if it never fired."""
        if not self.alarmed:
            return ""
        return (f"; collapse alarm on at {self.alarmed} of {self.diagnosed} diagnostics steps "
                f"(first at step {self.first})")


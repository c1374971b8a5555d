"""All MI diagnostics of one rollout, in one jittable call (docs/method.md#the-mi-diagnostics,
docs/method.md#the-collapse-alarm).

`diagnose(model, traj, key, config, state, group_size=...)` runs inside the train step on the
rollout before filtering, every `compute_freq` steps and at step 1 (the caller gates it). One
forward over the batch's buffers (`buffer_scoring.prefill_buffers`) provides the prompts of
every pair set; each set is then cross-scored on that cache:

- `mi/first_turn/*`: columns = the groups; every MI metric, its own EMA state, plus the
  token-level policy entropy of the reasoning and the mean reasoning length of the samples.
- `mi/trajectory/*`: a random turn of random trajectories, each its own column; the same.
- `mi/turn{t}/*` (`per_turn`): I(X_t; Z_t) by turn index, `per_turn_samples` samples each.
- `mi/action_state/*` and `mi/action_reasoning/*` (`action_grounding`), on the first turn:
    * state:     A_i = log p(a_i | x_j, z_i) over the group columns j — keep the sample's own
      reasoning, swap the state. Estimates I(X; A | Z): does the action still read the state
      beyond what the reasoning says? Scored in the same forward as the reasoning (the answer
      follows the reasoning in the generation), so it is free.
    * reasoning: R_i = log p(a_i | x, z_k) over the reasoning of every member k of i's group
      (same state x) — keep the state, swap the reasoning for another draw from p(z | x).
      Estimates I(Z; A | X): does the action follow the reasoning? The alternatives are
      on-distribution draws for that state, so the marginal is p(a | x). Needs whole groups:
      every trajectory's first turn is a row, the group_size members are its columns.
  Together: I(X; Z, A) = I(X; Z) + I(X; A | Z). A collapsed template with still-grounded actions
  shows low reasoning MI, high action_state and low action_reasoning (the reasoning is decorative).
- `mi/reasoning_length_mean`: over every turn played in the batch (not sampled).
- `mi/collapse_alarm` (0/1), `mi/collapse_peak`: the alarm of `collapse.py` on the first-turn
  MI-ZScore-EMA and reasoning entropy.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from ragen_jax.diagnostics import buffer_scoring, collapse, pairs as pairs_lib
from ragen_jax.diagnostics.buffer_scoring import Scoring
from ragen_jax.diagnostics.mi import MIEmaState, equivalent_columns, mi_metrics, reasoning_stats
from ragen_jax.models.decoder import Decoder

TURN_METRICS = ("mi_estimate", "mi_seq_estimate", "mi_zscore", "retrieval_acc", "retrieval_chance",
                "retrieval_above_chance")
ACTION_METRICS = ("mi_estimate", "mi_seq_estimate", "retrieval_acc", "retrieval_chance", "retrieval_above_chance")


@dataclasses.dataclass(frozen=True)
class DiagnosticsConfig:
    """Static diagnostics settings (defaults: docs/method.md#the-mi-diagnostics)."""

    compute_freq: int = 5  # run every k steps, and at step 1
    num_samples: int = 64  # first-turn and trajectory samples (capped at the batch)
    per_turn: bool = True  # I(X_t; Z_t) for every turn index
    per_turn_samples: int = 16  # samples (and columns) per turn index
    action_grounding: bool = True  # cross-scoring of the answer tokens
    answer_tokens: int = 32  # answers are scored on at most this many tokens
    alarm_drop: float = 0.5  # alarm when MI-ZScore-EMA fell this fraction below its peak ...
    alarm_entropy_tolerance: float = 0.1  # ... while the entropy fell by at most this (relative)
    alarm_below: float = 0.0  # ... and only while MI-ZScore-EMA is below this level (0: no such level)
    # ... and only once MI-ZScore-EMA has reached this level (0: no such level); 1 is far above a
    # real LM's ±0.01 noise, far below the grounded tiny model's peaks of 9 to 21 (docs/method.md)
    alarm_floor: float = 1.0
    prefill_rows: int = 8  # buffers per forward of the prefill (memory: rows × length²)
    # samples scored at a time under each column (0: all at once); bounds the scoring's working
    # set (the samples' prompt caches and vocabulary log-probs) on a large model
    score_rows: int = 0
    # > 1: each block of samples is scored only as wide as its longest reasoning (and answer)
    # needs, rounded up to one of this many widths (buffer_scoring.span_widths); the same
    # metrics up to float rounding, one scoring program per width
    span_buckets: int = 1

    def __post_init__(self):
        for name in ("compute_freq", "num_samples", "per_turn_samples", "answer_tokens", "prefill_rows",
                     "span_buckets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"diagnostics.{name}={value!r} must be an integer >= 1")
        if isinstance(self.score_rows, bool) or not isinstance(self.score_rows, int) or self.score_rows < 0:
            raise ValueError(f"diagnostics.score_rows={self.score_rows!r} must be an integer >= 0 (0: all at once)")
        for name in ("per_turn", "action_grounding"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"diagnostics.{name}={value!r} must be True or False")
        if not (isinstance(self.alarm_drop, (int, float)) and 0.0 < self.alarm_drop <= 1.0):
            raise ValueError(f"diagnostics.alarm_drop={self.alarm_drop!r} must be in (0, 1]")
        tol = self.alarm_entropy_tolerance
        if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0.0):
            raise ValueError(f"diagnostics.alarm_entropy_tolerance={tol!r} must be a finite number >= 0")
        below = self.alarm_below
        if isinstance(below, bool) or not isinstance(below, (int, float)) or not math.isfinite(below) or below < 0:
            raise ValueError(f"diagnostics.alarm_below={below!r} must be a finite number >= 0 (0: no absolute level)")
        floor = self.alarm_floor
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor) or floor < 0:
            raise ValueError(f"diagnostics.alarm_floor={floor!r} must be a finite number >= 0 (0: no floor)")


@struct.dataclass
class DiagnosticsState:
    """What the diagnostics carry from step to step (part of the train state)."""

    first_turn: MIEmaState  # EMA of std(marginal), first-turn samples
    trajectory: MIEmaState  # the same for trajectory samples (a separate state)
    collapse: collapse.CollapseState

    @classmethod
    def create(cls) -> "DiagnosticsState":
        return cls(MIEmaState.create(), MIEmaState.create(), collapse.CollapseState.create())


def buffer_cache(model: Decoder, traj, prefill_rows: int = 8, mesh=None):
    """(cache, tokens): the batch's buffers prefilled over every slot a prompt of any pair set
    may use — up to the last turn's generation offset, and the whole first turn (the [x, z]
    prompts of action grounding)."""
    offsets = traj.layout.generation_offsets
    width = max(offsets[-1], offsets[0] + traj.layout.generation)
    tokens = traj.tokens[:, :width]
    return buffer_scoring.prefill_buffers(model, tokens, traj.mask[:, :width], prefill_rows, mesh), tokens


def _score(model, cache, tokens, traj, pairs, cont, cont_mask, own: bool = False, scoring=Scoring()):
    """Cross product: every row of `pairs` under every column's prompt."""
    m, n = pairs.rows.shape[0], pairs.column_rows.shape[0]
    ends = jnp.asarray(traj.layout.generation_offsets, jnp.int32)[pairs.column_turns]
    columns = jnp.broadcast_to(pairs.column_rows[None, :], (m, n))
    return buffer_scoring.score_continuations(
        model, cache, tokens, pairs.prompt_width, columns, jnp.broadcast_to(ends[None, :], (m, n)), cont, cont_mask,
        own_column=pairs.true_column if own else None, scoring=scoring, shared_columns=True)


def _thinking_rate(pairs):
    return pairs.valid.sum().astype(jnp.float32) / jnp.maximum(pairs.drawn.sum(), 1).astype(jnp.float32)


def _mi_of_set(model, cache, tokens, traj, pairs, answer_tokens, ema, with_answer=False, with_stats=True,
               scoring=Scoring()):
    """The MI metrics of one pair set; with_stats: + reasoning entropy and length; with_answer:
    also the answer scores under the same columns (action state dependence)."""
    s = pairs_lib.samples(traj, pairs, answer_tokens)
    cont_mask = (s.reasoning_mask | s.answer_mask) if with_answer else s.reasoning_mask
    logp, entropy = _score(model, cache, tokens, traj, pairs, s.tokens, cont_mask, own=with_stats, scoring=scoring)
    scores, scores_sum = buffer_scoring.mean_and_sum(logp, s.reasoning_mask)
    equivalent = equivalent_columns(*pairs_lib.prompts(traj, pairs))
    metrics, ema = mi_metrics(scores, scores_sum, pairs.true_column, equivalent, pairs.valid, ema)
    metrics["valid_thinking_rate"] = _thinking_rate(pairs)
    if with_stats:
        metrics.update(reasoning_stats(entropy, s.reasoning_mask & pairs.drawn[:, None]))
    action = None
    if with_answer:
        a_scores, a_sum = buffer_scoring.mean_and_sum(logp, s.answer_mask)
        a_valid = pairs.valid & s.answer_mask.any(axis=1)
        a_metrics, _ = mi_metrics(a_scores, a_sum, pairs.true_column, equivalent, a_valid, MIEmaState.create())
        action = {k: a_metrics[k] for k in ACTION_METRICS}
        action["valid_rate"] = a_valid.sum().astype(jnp.float32) / jnp.maximum(pairs.drawn.sum(), 1)
    return metrics, ema, action


def action_reasoning_scores(model, cache, tokens, traj, group_size: int, answer_tokens: int, scoring=Scoring()):
    """R [B, K], R_sum, valid [B], equivalent [G, K, K]: answer of trajectory i = g·K + r under
    (its group's first-turn prompt, the first-turn reasoning of member c) for c < K."""
    batch = traj.tokens.shape[0]
    offset = traj.layout.generation_offset(0)
    everyone = jnp.arange(batch, dtype=jnp.int32)
    rows = pairs_lib.PairSet(rows=everyone, turns=jnp.zeros(batch, jnp.int32), drawn=traj.turn_active[:, 0],
                             valid=traj.turn_active[:, 0], true_column=everyone % group_size,
                             column_rows=everyone, column_turns=jnp.zeros(batch, jnp.int32), prompt_width=offset)
    s = pairs_lib.samples(traj, rows, answer_tokens)
    z_len = traj.reasoning_lengths[:, 0]
    columns = (everyone // group_size * group_size)[:, None] + jnp.arange(group_size, dtype=jnp.int32)[None, :]
    ends = offset + z_len[columns]  # the prompt [x, z_c] ends right after z_c
    width = offset + traj.layout.generation
    logp, _ = buffer_scoring.score_continuations(model, cache, tokens, width, columns, ends, s.answer,
                                                 s.answer_only_mask, scoring=scoring)
    scores, scores_sum = buffer_scoring.mean_and_sum(logp, s.answer_only_mask)
    valid = traj.turn_active[:, 0] & (z_len > 0) & s.answer_only_mask.any(axis=1)
    z = jnp.where(s.reasoning_mask, s.tokens, -1).reshape(batch // group_size, group_size, -1)
    equivalent = jnp.all(z[:, :, None, :] == z[:, None, :, :], axis=-1)  # identical reasoning
    return scores, scores_sum, valid, equivalent


def _action_reasoning(model, cache, tokens, traj, group_size, answer_tokens, scoring):
    """I(Z; A | X) per group (vmapped `mi_metrics`), pooled over groups by valid rows."""
    scores, scores_sum, valid, equivalent = action_reasoning_scores(model, cache, tokens, traj, group_size,
                                                                    answer_tokens, scoring)
    groups = traj.tokens.shape[0] // group_size
    split = lambda a: a.reshape((groups, group_size) + a.shape[1:])
    true_column = jnp.broadcast_to(jnp.arange(group_size), (groups, group_size))
    per_group, _ = jax.vmap(mi_metrics, in_axes=(0, 0, 0, 0, 0, None))(
        split(scores), split(scores_sum), true_column, equivalent, split(valid), MIEmaState.create())
    counts = split(valid).sum(axis=1).astype(jnp.float32)
    total = jnp.maximum(counts.sum(), 1.0)
    out = {k: jnp.sum(per_group[k] * counts) / total for k in ACTION_METRICS}
    out["valid_rate"] = valid.sum().astype(jnp.float32) / jnp.maximum(traj.turn_active[:, 0].sum(), 1)
    return out


def _per_turn(model, cache, tokens, traj, key, config, scoring):
    """A few metrics of I(X_t; Z_t) for each turn index t (one compiled body, `lax.map`)."""
    turns = traj.layout.turns

    def one(args):
        turn, turn_key = args
        pairs = pairs_lib.turn_pairs(traj, turn_key, turn, config.per_turn_samples)
        metrics, _, _ = _mi_of_set(model, cache, tokens, traj, pairs, config.answer_tokens, MIEmaState.create(),
                                   with_stats=False, scoring=scoring)
        out = {name: metrics[name] for name in TURN_METRICS}
        out["valid_samples"] = pairs.valid.sum().astype(jnp.float32)
        out["valid_thinking_rate"] = metrics["valid_thinking_rate"]
        return out

    return jax.lax.map(one, (jnp.arange(turns), jax.random.split(key, turns)))


def evaluation_config(rows: int, score_rows: int, span_buckets: int) -> DiagnosticsConfig:
    """The diagnostics `evaluate` runs on its `rows` trajectories: the first-turn and trajectory
    sets of at most 64 samples, no per-turn set, scored as the run scores them."""
    return DiagnosticsConfig(num_samples=min(64, rows), per_turn=False, score_rows=score_rows,
                             span_buckets=span_buckets)


def diagnose(
    model: Decoder,
    traj,
    key: jax.Array,
    config: DiagnosticsConfig,
    state: DiagnosticsState,
    *,
    group_size: int,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[dict[str, jax.Array], DiagnosticsState]:
    """Every diagnostic metric of one rollout (f32 scalars) and the updated state.

    traj: a `rollout.Trajectories` whose rows g·group_size … (g+1)·group_size − 1 are group g.
    Jit with `config`, `group_size` and `mesh` static. Keys: split(key, 3) → first-turn,
    trajectory and per-turn draws. On a `mesh` that splits only `data`, each device prefills and
    scores its own rows (`sharding.per_device_rows`); the metrics are one device's up to float
    rounding. `config.score_rows` scores that many samples at a time, `config.span_buckets`
    only as wide as they need.
    """
    k_first, k_traj, k_turn = jax.random.split(key, 3)
    cache, tokens = buffer_cache(model, traj, config.prefill_rows, mesh)
    scoring = Scoring(mesh, config.score_rows, config.span_buckets)
    metrics: dict[str, jax.Array] = {}

    first = pairs_lib.first_turn_pairs(traj, k_first, config.num_samples, group_size)
    first_metrics, first_ema, action_state = _mi_of_set(model, cache, tokens, traj, first, config.answer_tokens,
                                                        state.first_turn, with_answer=config.action_grounding,
                                                        scoring=scoring)
    metrics.update({f"mi/first_turn/{k}": v for k, v in first_metrics.items()})

    trajectory = pairs_lib.trajectory_pairs(traj, k_traj, config.num_samples)
    traj_metrics, traj_ema, _ = _mi_of_set(model, cache, tokens, traj, trajectory, config.answer_tokens,
                                           state.trajectory, scoring=scoring)
    metrics.update({f"mi/trajectory/{k}": v for k, v in traj_metrics.items()})

    if config.per_turn:
        per_turn = _per_turn(model, cache, tokens, traj, k_turn, config, scoring)
        for t in range(traj.layout.turns):
            metrics.update({f"mi/turn{t}/{k}": v[t] for k, v in per_turn.items()})

    if config.action_grounding:
        metrics.update({f"mi/action_state/{k}": v for k, v in action_state.items()})
        reasoning = _action_reasoning(model, cache, tokens, traj, group_size, config.answer_tokens, scoring)
        metrics.update({f"mi/action_reasoning/{k}": v for k, v in reasoning.items()})

    played = traj.turn_active
    metrics["mi/reasoning_length_mean"] = (jnp.sum(jnp.where(played, traj.reasoning_lengths, 0))
                                           / jnp.maximum(played.sum(), 1))

    collapse_state, alarm = collapse.update(
        state.collapse, first_metrics["mi_zscore_ema"], first_metrics["reasoning_token_entropy"],
        config.alarm_drop, config.alarm_entropy_tolerance, observed=first.valid.any(),
        below=config.alarm_below or math.inf, floor=config.alarm_floor)
    metrics["mi/collapse_alarm"] = alarm
    metrics["mi/collapse_peak"] = collapse_state.peak

    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return metrics, DiagnosticsState(first_turn=first_ema, trajectory=traj_ema, collapse=collapse_state)

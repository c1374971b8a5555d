"""Trajectories as text a person can read: each turn's observation as the model was shown it, its
output, the parsed actions and the reward (`evaluate`'s transcripts, the reasoning check)."""

from __future__ import annotations

from typing import Iterator, Sequence

import jax
import numpy as np

from ragen_jax.rollout.play import Trajectories


def _default_rows(batch: int, group_size: int, count: int) -> list[int]:
    """First sample of each level, then second samples, ...: distinct levels first."""
    group_size = max(1, min(group_size, batch))
    order = [g * group_size + m for m in range(group_size) for g in range(batch // group_size)]
    listed = set(order)
    order += [b for b in range(batch) if b not in listed]
    return order[:count]


def render_trajectories(
    traj: Trajectories,
    tokenizer,
    count: int = 4,
    *,
    action_names: Sequence[str] | None = None,
    group_size: int = 1,
    rows: Sequence[int] | None = None,
) -> str:
    """A few trajectories as text a person can read.

    For each trajectory: a header (row, level, sample), then per turn played the decoded
    observation (what the model was shown, chat markers included), the model's generation,
    the parsed actions (names when `action_names` are given, e.g. `env.action_names`) and the
    turn's reward; then the return and success. `rows` picks trajectories; by default
    `count` of them, distinct levels first (`group_size` = samples per level). The system
    message is shown once at the top; the segments come from the trajectories' `layout`.
    """
    host = jax.device_get(traj)
    tokens, mask = np.asarray(host.tokens), np.asarray(host.mask)
    batch = tokens.shape[0]
    layout = traj.layout
    if layout is None:
        raise ValueError("the trajectories have no buffer layout (not made by ragen_jax.rollout.play.rollout)")
    if rows is None:
        rows = _default_rows(batch, group_size, max(0, int(count)))
    rows = [int(b) for b in rows]
    for b in rows:
        if not 0 <= b < batch:
            raise ValueError(f"row {b} is out of range: the batch has {batch} trajectories")

    def decode(ids) -> str:
        return _decode(tokenizer, ids)

    def segment(b: int, where: slice) -> np.ndarray:
        return tokens[b, where][mask[b, where]]

    def action_name(a: int) -> str:
        if action_names is not None and 1 <= a <= len(action_names):
            return str(action_names[a - 1])
        return f"action {a}"

    group_size = max(1, int(group_size))
    turn_active, turn_valid = np.asarray(host.turn_active), np.asarray(host.turn_valid)
    turn_reward, turn_actions = np.asarray(host.turn_reward), np.asarray(host.turn_actions)
    gen_lengths = np.asarray(host.gen_lengths)

    out: list[str] = []
    if rows and layout.system > 0:
        out += ["#" * 72, "# System prompt (the same for every trajectory)", "#" * 72,
                _block(decode(segment(rows[0], slice(0, layout.system)))), ""]
    for n, b in enumerate(rows, start=1):
        played = int(turn_active[b].sum())
        success = bool(host.success[b])
        where = f"level {b // group_size}, sample {b % group_size + 1} of {group_size}" if group_size > 1 \
            else f"level {b}"
        out += ["=" * 72,
                f"Trajectory {n}/{len(rows)} (row {b}, {where}): return {float(host.episode_reward[b]):+.2f}, "
                f"{'SUCCESS' if success else 'no success'}, {played} turn(s)",
                "=" * 72]
        for t in range(layout.turns):
            if not turn_active[b, t]:
                out.append(f"(episode over after turn {t}; turns {t + 1}-{layout.turns} not played)")
                break
            actions = [action_name(int(a)) for a in turn_actions[b, t] if int(a) > 0]
            valid = bool(turn_valid[b, t])
            parsed = (", ".join(actions) if actions else "the answer text (read by the env)") if valid \
                else "none (invalid answer: format penalty, no env step)"
            out += [f"---- Turn {t + 1} ----",
                    "[observation]",
                    _block(decode(segment(b, layout.observation_slice(t)))),
                    f"[model output] ({int(gen_lengths[b, t])} tokens)",
                    _block(decode(segment(b, layout.generation_slice(t)))),
                    f"[parsed actions] {parsed}",
                    f"[reward] {float(turn_reward[b, t]):+.2f}"]
        out += [f"Final: return {float(host.episode_reward[b]):+.2f}, success: {'yes' if success else 'no'}, "
                f"{int(host.num_actions[b])} env action(s) in {played} turn(s)", ""]
    return "\n".join(out)


def turn_outputs(traj: Trajectories, tokenizer) -> Iterator[tuple[int, int, str]]:
    """(row, turn, the model's output) of every turn played, rows in order: the generated text
    as `render_trajectories` shows it."""
    host = jax.device_get(traj)
    tokens, mask, active = np.asarray(host.tokens), np.asarray(host.mask), np.asarray(host.turn_active)
    for b in range(tokens.shape[0]):
        for t in range(traj.layout.turns):
            if active[b, t]:
                where = traj.layout.generation_slice(t)
                yield b, t, _decode(tokenizer, tokens[b, where][mask[b, where]])


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _block(text: str) -> str:
    """Decoded text verbatim; an empty segment is marked so it is not mistaken for a gap."""
    return text if text else "(empty)"

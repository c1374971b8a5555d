"""Is the reasoning still right about the board? A check of the warm start's reasoning template.

The built-in tasks' warm start (`ragen_jax.sft`) reasons in a fixed template: "Player (r, c),
... I move A then B." The MI diagnostics say whether the reasoning depends on the board; they
cannot say whether it is *right* about it (wrong coordinates still depend on the board,
docs/results.md, "What RL does to the reasoning"). Each game grades what a turn's reasoning
states against the state that turn was shown (`TextView.grade_reasoning`, on the state arrays
the rollout records); this module counts, for every fact a game grades (`player`, and
FrozenLake's `holes` / Sokoban's `walls`: the moves into such a cell next to the player):

- `<fact>_stated`: share of turns that state it;
- `<fact>_right`: of those, share that state it right;
- `<fact>_top_share`: of those, share naming the most often named value — near the boards' own
  spread while the reasoning reads the board, near 1 when it has become a fixed string whatever
  the board (the paper's template collapse, seen in the coordinates: docs/results.md, "The
  collapse signature");
- `answer_repeats_reasoning`: of the turns whose reasoning names moves ("I move A then B."),
  share whose answer gives the same moves (the environment acts on the answer only).

`validation_metrics` runs it on a validation's trajectories; a policy that reasons freely (a
real checkpoint) gets no metrics, not zeros. benchmarks/board_reading.py adds a solver-graded
look at the first turn's plan.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Hashable, Iterable
from typing import Any

import jax

MOVES = re.compile(r"I move (.+?)\.\s*</think>\s*<answer>(.*?)</answer>", re.S)


def named_and_answered(output: str) -> tuple[list[str], list[str]] | None:
    """(moves the reasoning names, moves the answer gives) of one turn's output, if templated."""
    moves = MOVES.search(output)
    if not moves:
        return None
    return [m.strip() for m in moves.group(1).split(" then ")], [a.strip() for a in moves.group(2).split("||")]


def graded_turns(traj, tokenizer, env, env_params) -> Iterable[tuple[int, int, Any, dict, str]]:
    """(row, turn, the state it was shown, the game's grades, the output) of every turn played
    in host-side `traj`."""
    from ragen_jax.rollout.render import turn_outputs

    host = jax.device_get(traj)  # once, for the outputs and the states
    for b, t, output in turn_outputs(host, tokenizer):
        shown = jax.tree.map(lambda x: x[b, t], host.turn_states)
        yield b, t, shown, env.grade_reasoning(shown, env_params, output), output


def reading_scores(turns: Iterable[tuple[dict[str, tuple[Hashable, bool]], str]]) -> dict[str, float]:
    """`turns` counted, and the shares above over (grades, output) pairs, per fact some turn states."""
    count = with_moves = consistent = 0
    stated, right = collections.Counter(), collections.Counter()
    named = collections.defaultdict(collections.Counter)
    for grades, output in turns:
        count += 1
        for fact, (said, ok) in grades.items():
            stated[fact] += 1
            right[fact] += bool(ok)
            named[fact][said] += 1
        moves = named_and_answered(output)
        if moves:
            with_moves += 1
            consistent += moves[0] == moves[1]
    scores = {"turns": count, "answer_repeats_reasoning": consistent / max(with_moves, 1)}
    for fact, n in stated.items():
        scores.update({f"{fact}_stated": n / count, f"{fact}_right": right[fact] / n,
                       f"{fact}_top_share": max(named[fact].values()) / n})
    return scores


def validation_metrics(traj, tokenizer, env, env_params) -> dict[str, float]:
    """Every share of `reading_scores`, as `reasoning/<name>`, over every turn of host-side `traj`
    (e.g. `distributed.to_host` of a validation's) played in `env`, or {} when no turn states a
    fact the game grades (the template is not in use)."""
    scores = reading_scores((grades, out) for *_, grades, out in graded_turns(traj, tokenizer, env, env_params))
    if not any(name.endswith("_stated") for name in scores):  # no turn stated a fact
        return {}
    return {f"reasoning/{k}": float(share) for k, share in scores.items() if k != "turns"}

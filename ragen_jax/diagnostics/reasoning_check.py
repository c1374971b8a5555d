"""Is the reasoning still right about the board? A check of the warm start's reasoning template.

The built-in tasks' warm start (`ragen_jax.sft`) reasons in a fixed template: "Player (r, c),
... I move A then B." The MI diagnostics say whether the reasoning depends on the board; they
cannot say whether it is *right* about it (wrong coordinates still depend on the board,
docs/results.md, "What RL does to the reasoning"). For turns that follow the template this
module checks, on the host and against the text of the board the turn was shown:

- `player_stated`: share of turns that state the player's cell;
- `player_right`: of those, share whose cell is the board's `P` (or `S`, player on target);
- `player_top_share`: of those, share naming the most often named cell — near the boards' own
  spread while the reasoning reads the board, near 1 when it has become a fixed string whatever
  the board (the paper's template collapse, seen in the coordinates: docs/results.md, "The collapse signature");
- `answer_repeats_reasoning`: of the turns that name moves, share whose answer gives the same
  moves (the environment acts on the answer only);
- when the reasoning names the moves into the cells next to the player that block them
  (FrozenLake "holes: Left, Down", Sokoban "walls: Up" or "…: none"): `holes_stated` /
  `walls_stated`, the share of turns that do, and `holes_right` / `walls_right`, of those, the
  share naming exactly the board's holes (`O`) or walls (`#`) next to the player.

`validation_metrics` runs it on a validation's trajectories; a policy that reasons freely (a
real checkpoint) gets no metrics, not zeros. benchmarks/board_reading.py adds a solver-graded
look at the first turn's plan.
"""

from __future__ import annotations

import collections
import re
from typing import Iterator

import numpy as np

from ragen_jax.envs.text_view import moves_into

PLAYER = re.compile(r"Player \((\d+), (\d+)\)")
BLOCKED = re.compile(r"(holes|walls): ([A-Za-z, ]*?)\.")
BLOCKING_SYMBOL = {"holes": "O", "walls": "#"}  # the cell a named move would go into
MOVES = re.compile(r"I move (.+?)\.\s*</think>\s*<answer>(.*?)</answer>", re.S)
_BOARD = re.compile(r"State:\n(.*?)\nYou have", re.S)
_OUTPUT = re.compile(r"\[model output\][^\n]*\n(.*?)\n\[", re.S)


def cells(board: str) -> list[list[str]]:
    """A rendered grid as rows of cell symbols."""
    return [row.split() for row in board.strip().split("\n")]


def turns_of(text: str) -> Iterator[tuple[list[list[str]], str]]:
    """(board cells, model output) of every turn in `evaluation.render_trajectories` text."""
    for block in text.split("---- Turn ")[1:]:
        board, output = _BOARD.search(block), _OUTPUT.search(block)
        if board and output:
            yield cells(board.group(1)), output.group(1)


def named_and_answered(output: str) -> tuple[list[str], list[str]] | None:
    """(moves the reasoning names, moves the answer gives) of one turn's output, if templated."""
    moves = MOVES.search(output)
    if not moves:
        return None
    return [m.strip() for m in moves.group(1).split(" then ")], [a.strip() for a in moves.group(2).split("||")]


def reading_scores(text: str) -> dict[str, float]:
    """`turns` played, and the shares above, over every turn in the rendered text (the shares
    of holes or walls only when some turn names them)."""
    turns = coords_right = stated = consistent = with_moves = 0
    named, blocked_stated, blocked_right = collections.Counter(), collections.Counter(), collections.Counter()
    for rows, output in turns_of(text):
        turns += 1
        player = [(i, j) for i, row in enumerate(rows) for j, cell in enumerate(row) if cell in ("P", "S")]
        said = PLAYER.search(output)
        if said:
            stated += 1
            cell = (int(said.group(1)), int(said.group(2)))
            named[cell] += 1
            coords_right += bool(player) and cell == player[0]
        blocked = BLOCKED.search(output)
        if blocked:
            kind = blocked.group(1)
            blocked_stated[kind] += 1
            said_moves = {m.strip() for m in blocked.group(2).split(",")} - {"none"}
            board = np.asarray(rows) == BLOCKING_SYMBOL[kind]
            blocked_right[kind] += bool(player) and said_moves == set(moves_into(board, player[0]))
        moves = named_and_answered(output)
        if moves:
            with_moves += 1
            consistent += moves[0] == moves[1]
    scores = {"turns": turns, "player_stated": stated / max(turns, 1),
              "player_right": coords_right / max(stated, 1),
              "player_top_share": max(named.values(), default=0) / max(stated, 1),
              "answer_repeats_reasoning": consistent / max(with_moves, 1)}
    for kind, count in blocked_stated.items():
        scores.update({f"{kind}_stated": count / turns, f"{kind}_right": blocked_right[kind] / count})
    return scores


def validation_metrics(traj, tokenizer) -> dict[str, float]:
    """Every share of `reading_scores`, as `reasoning/<name>`, over every turn of host-side `traj`
    (e.g. `distributed.to_host` of a validation's), or {} when no turn states the player's cell
    (the template is not in use)."""
    from ragen_jax.rollout.render import render_trajectories

    rows = list(range(traj.tokens.shape[0]))
    scores = reading_scores(render_trajectories(traj, tokenizer, rows=rows))
    if scores["player_stated"] == 0:
        return {}
    return {f"reasoning/{k}": float(share) for k, share in scores.items() if k != "turns"}

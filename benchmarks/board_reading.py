"""Does the policy read the board? Checks its own reasoning against the board it was shown.

    python benchmarks/board_reading.py --env sokoban                 # the shipped warm start
    python benchmarks/board_reading.py --workdir runs/sokoban_tiny   # a run's latest checkpoint

Plays the validation levels (config `eval.*`, `--episodes` of them) and, for every turn the
warm-start reasoning template was followed ("Player (r, c), ... I move A then B."), checks
(1) the stated player coordinates against the `P`/`S` cell of the board shown that turn, and
(2) that the answer repeats the moves the reasoning names. Success is bounded by both: a
policy that cannot locate itself cannot plan, whatever RL does with its rewards.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

PLAYER = re.compile(r"Player \((\d+), (\d+)\)")
MOVES = re.compile(r"I move (.+?)\.\s*</think>\s*<answer>(.*?)</answer>", re.S)


def turns_of(text: str):
    """(board rows, model output) of every turn in `render_trajectories` text."""
    for block in text.split("---- Turn ")[1:]:
        board = re.search(r"State:\n(.*?)\nYou have", block, re.S)
        output = re.search(r"\[model output\][^\n]*\n(.*?)\n\[", block, re.S)
        if board and output:
            yield [row.split() for row in board.group(1).strip().split("\n")], output.group(1)


def reading_scores(text: str) -> dict[str, float]:
    """Share of turns whose stated player cell is right / whose answer repeats the reasoning."""
    turns = coords_right = stated = consistent = with_moves = 0
    for rows, output in turns_of(text):
        turns += 1
        player = [(i, j) for i, row in enumerate(rows) for j, cell in enumerate(row) if cell in ("P", "S")]
        said = PLAYER.search(output)
        if said:
            stated += 1
            coords_right += bool(player) and (int(said.group(1)), int(said.group(2))) == player[0]
        moves = MOVES.search(output)
        if moves:
            with_moves += 1
            named = [m.strip() for m in moves.group(1).split(" then ")]
            answered = [a.strip() for a in moves.group(2).split("||")]
            consistent += named == answered
    return {"turns": turns, "player_stated": stated / max(turns, 1),
            "player_right": coords_right / max(stated, 1), "answer_repeats_reasoning": consistent / max(with_moves, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--env", choices=("sokoban", "frozenlake"), help="the shipped warm start of configs/<env>_tiny.py")
    source.add_argument("--workdir", type=Path, help="a training run: its latest checkpoint")
    parser.add_argument("--episodes", type=int, default=128)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes} must be >= 1")

    from ragen_jax.checkpoint import CheckpointError
    from ragen_jax.config import ConfigError
    from ragen_jax.evaluation import EvalConfig, render_trajectories, validate
    from ragen_jax.experiment import make_experiment, restore_run

    try:
        if args.workdir:
            exp, step = restore_run(args.workdir)
            what = f"{args.workdir} step {step}"
        else:
            import reproduce

            exp = make_experiment(reproduce.run_config(args.env, 0, {}))
            what = f"builtin:{args.env}-tiny"
    except (ConfigError, CheckpointError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    e = exp.config.eval
    eval_config = EvalConfig(num_envs=args.episodes, samples_per_env=1, temperature=e.temperature, seed=e.seed)
    metrics, traj = validate(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, eval_config,
                             exp.run.step.rollout, exp.mesh)
    text = render_trajectories(traj, exp.tokenizer, rows=list(range(args.episodes)), prompt=exp.prompt)
    scores = reading_scores(text)
    print(f"{what}: {args.episodes} validation levels at temperature {e.temperature}, {scores['turns']} turns")
    print(f"  success                               {metrics['success']:.3f}")
    print(f"  turns stating the player's cell       {scores['player_stated']:.3f}")
    print(f"  ... with the right cell               {scores['player_right']:.3f}")
    print(f"  answers repeating the reasoning's moves {scores['answer_repeats_reasoning']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

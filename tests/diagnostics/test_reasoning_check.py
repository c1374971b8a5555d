"""The reasoning-template check against hand-written rendered turns, and on real validations:
the shipped warm start follows the template (tests/sft), a random model gets no metrics."""

from ragen_jax.diagnostics import reasoning_check

TURN = """---- Turn {n} ----
[observation]
Turn {n}:
State:
# # # #
# _ {a} #
# {b} _ #
# # # #
You have 4 actions left. Always output: ...<|im_end|>
<|im_start|>assistant
<think>
[model output] (20 tokens)
 {output}
[parsed actions] action 1
"""


def test_scores_count_right_cells_and_consistent_answers():
    text = "header\n" + "".join([
        TURN.format(n=1, a="P", b="_", output="Player (1, 2), goal (2, 1). I move Left then Down. </think> "
                                              "<answer> Left || Down </answer>"),  # right cell, consistent
        TURN.format(n=2, a="_", b="S", output="Player (1, 2), goal (2, 1). I move Up. </think> "
                                              "<answer> Down </answer>"),  # wrong cell (S at 2,1), inconsistent
        TURN.format(n=3, a="P", b="_", output="garbled </think> <answer> Up </answer>"),  # no template
    ])
    scores = reasoning_check.reading_scores(text)
    assert scores["turns"] == 3
    assert scores["player_stated"] == 2 / 3
    assert scores["player_right"] == 1 / 2
    assert scores["answer_repeats_reasoning"] == 1 / 2
    assert scores["player_top_share"] == 1.0  # both stating turns name (1, 2)


def test_top_share_tells_a_fixed_string_from_a_reading():
    def turn(n, a, b, said):
        return TURN.format(n=n, a=a, b=b, output=f"Player {said}, goal (1, 1). I move Up. </think> <answer> Up </answer>")

    reading = "".join([turn(1, "P", "_", "(1, 2)"), turn(2, "_", "P", "(2, 1)"), turn(3, "P", "_", "(1, 2)"),
                       turn(4, "_", "P", "(2, 1)")])
    fixed = "".join([turn(1, "P", "_", "(2, 2)"), turn(2, "_", "P", "(2, 2)"), turn(3, "P", "_", "(2, 2)"),
                     turn(4, "_", "P", "(2, 1)")])
    read, stuck = reasoning_check.reading_scores(reading), reasoning_check.reading_scores(fixed)
    assert (read["player_right"], read["player_top_share"]) == (1.0, 0.5)
    assert (stuck["player_right"], stuck["player_top_share"]) == (0.25, 0.75)


LAKE_TURN = """---- Turn {n} ----
[observation]
State:
_ G {p0} _
_ O {p1} _
{p2} _ O _
You have 4 actions left. Always output: ...<|im_end|>
[model output] (20 tokens)
 {output}
[parsed actions] action 1
"""


def test_hole_names_are_checked_against_the_player_neighbours():
    """FrozenLake's template names the moves that step into a hole (`O`); Sokoban's never does."""
    def turn(n, where, holes):
        cells = {k: "P" if k == where else "_" for k in ("p0", "p1", "p2")}
        return LAKE_TURN.format(n=n, **cells, output=f"Player (0, 0), goal (0, 1), holes: {holes}. I move Up. "
                                                     "</think> <answer> Up </answer>")

    text = "".join([turn(1, "p0", "none"),          # (0, 2): G, _, _ around it -> right
                    turn(2, "p1", "Left, Down"),    # (1, 2): Left (1, 1) and Down (2, 2) are holes -> right
                    turn(3, "p1", "Down"),          # misses Left -> wrong
                    turn(4, "p2", "Right"),         # (2, 0): no hole next to it -> wrong
                    LAKE_TURN.format(n=5, p0="P", p1="_", p2="_", output="free text </think> <answer> Up </answer>")])
    scores = reasoning_check.reading_scores(text)
    assert scores["holes_stated"] == 4 / 5
    assert scores["holes_right"] == 2 / 4
    sokoban = TURN.format(n=1, a="P", b="_", output="Player (1, 2), goal (2, 1). I move Up. </think> <answer> Up </answer>")
    assert "holes_right" not in reasoning_check.reading_scores(sokoban)


def test_wall_names_are_checked_against_the_player_neighbours():
    """Sokoban's template with walls names the moves into a wall (`#`) next to the player."""
    def turn(n, output):
        return TURN.format(n=n, a="P", b="_", output=f"Player (1, 2), {output}. I move Left. "
                                                     "</think> <answer> Left </answer>")

    text = "".join([turn(1, "walls: Up, Right"),      # (1, 2): # above and right, _ left and below -> right
                    turn(2, "walls: Up"),             # misses Right -> wrong
                    turn(3, "walls: Right, Up"),      # any order -> right
                    turn(4, "box (2, 1)")])           # names none
    scores = reasoning_check.reading_scores(text)
    assert scores["walls_stated"] == 3 / 4 and scores["walls_right"] == 2 / 3
    assert "holes_right" not in scores

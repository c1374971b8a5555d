"""The registry's names and overrides, and the demo command a new user runs first."""

import subprocess
import sys

import pytest

from ragen_jax.envs import registry
from ragen_jax.envs.demo import main as demo_main


def test_presets_and_overrides():
    env, params = registry.make("sokoban")
    assert env.name == "sokoban" and params.dim_room == (6, 6) and params.num_boxes == 1
    _, larger = registry.make("LargerSokoban", max_steps=50)
    assert larger.dim_room == (8, 8) and larger.num_boxes == 2 and larger.max_steps == 50
    lake_env, lake = registry.make("frozenlake", success_rate=1.0)
    assert lake_env.action_names == ("Left", "Down", "Right", "Up") and lake.success_rate == 1.0


def test_unknown_name_or_parameter_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown environment 'sokobn'; allowed: .*SimpleSokoban"):
        registry.make("sokobn")
    with pytest.raises(ValueError, match="unknown parameter 'boxes' for SimpleSokoban; allowed: .*num_boxes"):
        registry.make("sokoban", boxes=2)
    with pytest.raises(ValueError, match="num_boxes=0"):
        registry.make("sokoban", num_boxes=0)


@pytest.mark.parametrize("env", ["sokoban", "frozenlake"])
def test_demo_prints_levels_and_a_solved_episode(env, capsys):
    assert demo_main(["--env", env, "--levels", "2", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"--- {env} level") == 2
    assert "optimal solution" in out
    assert "episode return" in out
    if env == "sokoban":
        assert "success" in out.splitlines()[-1] and "not solved" not in out.splitlines()[-1]


def test_demo_rejects_unknown_env_with_one_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "ragen_jax.envs.demo", "--env", "chess"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "invalid choice: 'chess'" in result.stderr
    assert "Traceback" not in result.stderr

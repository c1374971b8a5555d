"""`plan --programs`: every program the commands run compiles ahead of time, with nothing
allocated, on the shapes a run of the config gives it (here the tiny config cut to one short turn,
on two fake CPU devices; the same code compiles for a TPU target, tests/analysis/test_tpu_plan.py)."""

import json
from pathlib import Path

import pytest

from ragen_jax.analysis import programs
from ragen_jax.cli import plan
from ragen_jax.run import config as config_lib

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "sokoban_tiny.py")
REDUCED = {"rollout.num_groups": "8", "rollout.group_size": "2", "rollout.max_turns": "1",
           "rollout.max_new_tokens": "8", "algo.mini_batch_size": "16", "algo.micro_batch_size": "8",
           "diagnostics.enabled": "false", "model.init": "None", "eval.num_envs": "8", "eval.samples_per_env": "2"}


@pytest.fixture(scope="module")
def compiled():
    config = config_lib.apply_overrides(config_lib.load_config_file(TINY), REDUCED)
    return programs.compile_programs(config, (2, 1, 1), None, None)


def test_every_program_compiles_with_its_memory(compiled):
    assert tuple(compiled) == programs.PROGRAMS
    for name, result in compiled.items():
        assert result.does_not_fit is None and result.memory["peak"] >= result.memory["argument"] > 0, name
    # the fit's step and the train step both take the policy's weights; validation only reads them
    step, validation = compiled["train step"].memory, compiled["validation"].memory
    assert validation["output"] < step["output"]  # the train step returns the whole train state


def test_the_command_prints_a_line_per_program_and_writes_json(compiled, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(programs, "compile_programs", lambda *args, **kwargs: compiled)  # compiled once above
    out = tmp_path / "programs.json"
    assert plan.main(["--config", TINY, "--mesh", "2x1x1", "--programs", "--json", str(out),
                      *(f"--config.{k}={v}" for k, v in REDUCED.items())]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "every program of the commands, compiled for the devices present:"
    assert [line.split()[0] for line in lines[1:]] == ["train", "validation", "evaluation", "supervised"]
    data = json.loads(out.read_text())
    assert data["target"] is None and data["fits"] is True and set(data["programs"]) == set(programs.PROGRAMS)

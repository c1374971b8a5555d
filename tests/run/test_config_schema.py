"""The ConfigDict generated from the settings dataclasses: its defaults, typed overrides and
unset (None) keys."""

from pathlib import Path

import pytest

from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.run import config as config_lib
from ragen_jax.core.errors import ConfigError
from ragen_jax.run.schema import Settings

ROOT = Path(__file__).resolve().parents[2]


def build(overrides):
    return config_lib.build(config_lib.apply_overrides(config_lib.default_config(), overrides), 1)


def test_the_defaults_are_the_dataclasses():
    run = build({})
    assert run.settings == Settings()
    assert run.step.algo == AlgoConfig.preset("ppo") and run.step.rollout == Settings().rollout.rollout_config()
    assert run.values == config_lib.default_config().to_dict()


def test_an_optional_key_is_unset_with_none_and_set_by_its_type():
    assert build({"env.render_format": "grid_coord"}).env_overrides == {"render_format": "grid_coord"}
    run = build({"env.max_steps": "50", "algo.dual_clip": "3", "model.init": "builtin:sokoban-tiny"})
    assert (run.env_overrides, run.step.algo.dual_clip, run.settings.model.init) == ({"max_steps": 50}, 3.0,
                                                                                     "builtin:sokoban-tiny")
    config = config_lib.apply_overrides(config_lib.default_config(), {"env.max_steps": "50"})
    run = config_lib.build(config_lib.apply_overrides(config, {"env.max_steps": "None"}), 1)
    assert run.env_overrides == {} and run.values["env"]["max_steps"] is None


def test_an_unset_algorithm_choice_is_the_algorithms():
    algo = build({"algo.name": "grpo"}).step.algo
    assert (algo.advantage, algo.aggregation) == ("grpo", "seq-mean-token-mean")
    assert build({"algo.name": "grpo", "algo.aggregation": "token-mean"}).step.algo.aggregation == "token-mean"


@pytest.mark.parametrize("overrides, line", [
    ({"rollout.group_size": "None"}, "--config.rollout.group_size='None': expected an integer"),
    ({"env.max_steps": "many"}, "--config.env.max_steps='many': expected an integer or None (unset)"),
    ({"algo.dual_clip": "0.5"}, "algo.dual_clip=0.5 must be > 1 (or None)"),
    ({"mesh.data": "0"}, "mesh.data=0 must be >= 1, or -1 (all devices the other axes leave)"),
    ({"early_stop.val_patience": "-1"}, "early_stop.empty_batches=5, reward_std_collapse=5 and val_patience=-1"),
    ({"eval.num_envs": "0"}, "eval.num_envs=0 must be an integer >= 1"),
    ({"model.preset": "None"}, "model.path is required"),
    ({"model.dtype": "float16"}, "model.dtype='float16' is not supported; allowed: float32, bfloat16"),
    ({"model.vocab_chunk": "-1"}, "model.vocab_chunk=-1 must be >= 0"),
    ({"env.render_format": "text"}, "env.render_format='text' is not one of grid, grid_coord (or None for the "
                                    "preset's grid)"),
    ({"env.name": "Countdown", "env.render_format": "grid"}, "env.render_format='grid' is only used by FrozenLake, "
                                                             "LargerSokoban, SimpleSokoban, not Countdown"),
])
def test_a_bad_value_is_one_line_naming_the_key(overrides, line):
    with pytest.raises(ConfigError) as err:
        build(overrides)
    assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)


def test_the_model_numerics_are_the_decoders():
    """The `model` keys that set `DecoderConfig` fields default to the decoder's values."""
    from ragen_jax.models.config import DecoderConfig

    assert Settings().model.options() == DecoderConfig.numeric_defaults()
    assert config_lib.model_options(config_lib.default_config()) == DecoderConfig.numeric_defaults()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.py")), ids=lambda p: p.name)
def test_every_shipped_config_builds(path):
    """Each config file loads and validates as a whole (with a placeholder checkpoint where the
    config needs a user's own)."""
    config = config_lib.load_config_file(str(path))
    if config.model.preset is None and config.model.path is None:
        config.model.path = "/checkpoint/of/the/user"
    config_lib.build(config, device_count=8)


def test_the_smollm2_configs_find_the_packaged_model():
    from ragen_jax.models import packaged

    laptop = config_lib.load_config_file(str(ROOT / "configs" / "sokoban_smollm2.py"))
    paper = config_lib.load_config_file(str(ROOT / "configs" / "sokoban_smollm2_paper.py"))
    for config in (laptop, paper):
        assert packaged.resolve(config.model.path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert config.model.scan_layers and config.env.name == "SimpleSokoban"
    paper = config_lib.build(paper, device_count=8).step.rollout
    assert (paper.num_groups, paper.group_size, paper.max_turns, paper.max_new_tokens) == (8, 16, 5, 120)
    assert config_lib.load_config_file(str(ROOT / "configs" / "sokoban_smollm2_paper.py")).model.dtype == "bfloat16"


def built_beside_its_base(config_file: str, base_file: str, overrides: dict, device_count: int):
    """(the built config of `config_file`, the differences from `base_file` with `overrides`
    built alike); both read with a user's checkpoint path, as they need one."""
    config = config_lib.load_config_file(str(ROOT / "configs" / config_file))
    base = config_lib.apply_overrides(config_lib.load_config_file(str(ROOT / "configs" / base_file)), overrides)
    for c in (config, base):
        c.model.path = "/checkpoint/of/the/user"
    built = config_lib.build(config, device_count=device_count)
    return built, config_lib.differences(config_lib.build(base, device_count=device_count).values, built.values)


def test_the_7b_v5e8_config_is_the_paper_setting_with_lora_over_fsdp_4_and_tensor_2():
    """The setting the TPU compiler fits on a v5e-8 (docs/scaling.md): the 3B config's paper
    setting with LoRA rank 16 and the tensor axis 2, nothing else changed."""
    built, differences = built_beside_its_base("sokoban_qwen2p5_7b_v5e8.py", "sokoban_qwen2p5_3b.py",
                                               {"model.lora.rank": "16", "mesh.tensor": "2"}, device_count=8)
    assert built.mesh_shape == (1, 4, 2) and built.step.algo.name == "ppo"
    assert built.settings.model.lora.rank == 16
    assert differences == []


def test_the_3b_v5e4_config_is_the_paper_setting_in_bfloat16_with_stochastic_rounding_over_fsdp_2_and_tensor_2():
    """The setting the TPU compiler fits on a v5e-4 (docs/scaling.md): the 3B config's paper
    setting, every weight trained, with bfloat16 weights rounded stochastically, bfloat16
    moments and the tensor axis 2, nothing else changed."""
    built, differences = built_beside_its_base(
        "sokoban_qwen2p5_3b_v5e4.py", "sokoban_qwen2p5_3b.py",
        {"model.param_dtype": "bfloat16", "algo.adam_moments": "bfloat16", "algo.weight_rounding": "stochastic",
         "mesh.tensor": "2"}, device_count=4)
    assert built.mesh_shape == (1, 2, 2) and built.step.algo.name == "ppo"
    assert built.settings.model.lora.rank == 0 and built.step.algo.weight_rounding == "stochastic"
    assert differences == []


def test_the_0p5b_ppo_v5e1_config_is_the_paper_setting_with_bfloat16_moments_and_micro_batches_of_4():
    """The PPO setting the TPU compiler fits on one v5e chip with the diagnostics on
    (docs/scaling.md): the 0.5B paper config, every weight trained, with bfloat16 moments and
    micro-batches of 4, nothing else changed."""
    built, differences = built_beside_its_base("sokoban_qwen2p5_0p5b_ppo_v5e1.py", "sokoban_qwen2p5_0p5b.py",
                                               {"algo.adam_moments": "bfloat16", "algo.micro_batch_size": "4"},
                                               device_count=1)
    assert built.step.algo.name == "ppo" and built.settings.model.lora.rank == 0
    assert built.step.algo.micro_batch_size == 4 and built.settings.model.param_dtype == "float32"
    assert differences == []

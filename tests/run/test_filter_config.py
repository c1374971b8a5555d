"""The `filter` config keys: defaults, one-line errors, and saved run configs from before
`filter.update` existed or when `filter.metric` had its earlier name."""

from pathlib import Path

import pytest

from ragen_jax.run import config as config_lib
from ragen_jax.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def built_filter(config):
    return config_lib.build(config, 1).step.filter


def test_defaults_are_the_papers_and_the_tiny_configs_keep_what_they_were_measured_with():
    default = built_filter(config_lib.default_config())
    assert (default.metric, default.ddof, default.update) == ("reward_var", 1, "paper")
    for name in ("sokoban_tiny", "frozenlake_tiny"):
        tiny = built_filter(config_lib.load_config_file(str(ROOT / "configs" / f"{name}.py")))
        assert (tiny.metric, tiny.update) == ("reward_std", "fewer_steps"), name


@pytest.mark.parametrize("overrides, line", [
    ({"filter.update": "fewest"}, "filter.update='fewest' is not supported; allowed: paper, fewer_steps"),
    ({"filter.metric": "variance"}, "filter.metric='variance' is not supported; allowed: reward_var, reward_std"),
    ({"filter.ddof": "-1"}, "filter.ddof=-1 must be an integer >= 0"),
    ({"filter.ddof": "4", "rollout.group_size": "4"},
     "filter.metric='reward_var' with filter.ddof=4 needs group_size > 4 (got 4)"),
    ({"filter.ddof": "0.5"}, "--config.filter.ddof='0.5': expected an integer"),
])
def test_a_bad_filter_key_is_one_line_naming_it(overrides, line):
    with pytest.raises(ConfigError) as err:
        built_filter(config_lib.apply_overrides(config_lib.default_config(), overrides))
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_overrides_reach_the_filter():
    config = config_lib.apply_overrides(config_lib.default_config(), {
        "filter.update": "fewer_steps", "filter.ddof": "0", "filter.metric": "reward_variance"})
    filt = built_filter(config)
    assert (filt.update, filt.ddof, filt.metric) == ("fewer_steps", 0, "reward_std")


def test_a_run_saved_before_the_update_key_ran_fewer_steps_on_the_std():
    """A config saved before `filter.update` existed, with the std under its earlier name, is
    the tiny configs' filter today: no difference, so the run resumes; against the paper's
    defaults both keys differ, so it does not resume silently with another update."""
    tiny = config_lib.load_config_file(str(ROOT / "configs" / "sokoban_tiny.py")).to_dict()
    saved = config_lib.load_config_file(str(ROOT / "configs" / "sokoban_tiny.py")).to_dict()
    saved["filter"].pop("update")
    saved["filter"].pop("ddof")
    saved["filter"]["metric"] = "reward_variance"
    assert config_lib.differences(saved, tiny) == []
    paper = {**tiny, "filter": {**tiny["filter"], "metric": "reward_var", "update": "paper"}}
    assert config_lib.differences(saved, paper) == ["filter.metric: 'reward_std' -> 'reward_var'",
                                                    "filter.update: 'fewer_steps' -> 'paper'"]
    assert saved["filter"]["metric"] == "reward_variance" and "update" not in saved["filter"]  # left as it was

"""`algo.micro_batch_size="auto"`: the config accepts it, the search picks the largest candidate
whose compiled forward+backward fits the given memory beside the train state, and the run
records the number it chose (config.json), which a resumed run keeps."""

import json

import pytest
from flax import nnx

from ragen_jax.core.errors import ConfigError
from ragen_jax.core.sharding import device_bytes
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rollout.layout import buffer_layout
from ragen_jax.rollout.play import RolloutConfig
from ragen_jax.run import config as config_lib
from ragen_jax.run import loop
from ragen_jax.run.experiment import make_experiment
from ragen_jax.training import micro_batch
from ragen_jax.training.step import StepConfig, Trainer, resolve_micro_batch

from agent_setup import step_parts
from commands import CONFIG, SMALL

ROLLOUT = RolloutConfig(num_groups=2, group_size=4, max_turns=1, max_actions_per_turn=2, max_actions_per_traj=2,
                        max_new_tokens=8)


@pytest.fixture(scope="module")
def parts():
    return step_parts(ROLLOUT.max_actions_per_turn)


def auto_trainer(parts, gib):
    env, params, codec, prompt, model = parts
    algo = AlgoConfig.preset("grpo", mini_batch_size=8, micro_batch_size="auto", micro_batch_memory_gib=gib)
    config = resolve_micro_batch(StepConfig(rollout=ROLLOUT, filter=FilterConfig(), algo=algo), model, env, params,
                                 codec, prompt)
    return Trainer(config, model, env, params, codec, prompt)


def forward_backward_bytes(parts, rows):
    """What one device holds for a micro-batch of `rows`, read from the compiled program's
    memory analysis: temporaries, the gradients and their running sum, the micro-batch."""
    env, params, codec, prompt, model = parts
    layout = buffer_layout(env, params, codec, prompt, ROLLOUT)
    batch = micro_batch.micro_batch_inputs(rows, layout.length, layout.turns * layout.generation, None)
    compiled = micro_batch.compile_gradient(nnx.graphdef(model), micro_batch.abstract_params(nnx.state(model), None),
                                            batch, None)
    stats = compiled.memory_analysis()
    return stats.temp_size_in_bytes + 2 * stats.output_size_in_bytes + device_bytes(batch)


def state_bytes(trainer, model):
    s = trainer.abstract_state(model)
    return device_bytes((s.policy, s.policy_opt, s.critic, s.critic_opt, s.reference))


# ----------------------------------------------------------------------------- the config


def build(overrides):
    return config_lib.build(config_lib.apply_overrides(config_lib.default_config(), overrides), 1)


def test_auto_is_accepted_in_overrides_and_config_files():
    assert build({"algo.micro_batch_size": "auto"}).step.algo.micro_batch_size == "auto"
    assert build({"algo.micro_batch_size": "16"}).step.algo.micro_batch_size == 16
    config = config_lib.default_config()
    config.algo.micro_batch_size = "auto"  # as a config file sets it
    assert config_lib.build(config, 1).values["algo"]["micro_batch_size"] == "auto"


@pytest.mark.parametrize("value", ["big", "Auto", "-2", "1.5"])
def test_other_values_are_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as err:
        build({"algo.micro_batch_size": value})
    assert str(err.value) == f"algo.micro_batch_size={value if value == '-2' else repr(value)} must be an integer " \
                             ">= 0 or 'auto'", str(err.value)
    with pytest.raises(ConfigError, match="algo.micro_batch_memory_gib=-1.0 must be >= 0"):
        build({"algo.micro_batch_memory_gib": "-1"})


# ----------------------------------------------------------------------------- the search


def test_candidates_give_every_row_shard_whole_rows_largest_first():
    assert micro_batch.candidates(32, 1) == [32, 16, 8, 4, 2, 1]
    assert micro_batch.candidates(24, 4) == [24, 12, 8, 4]
    assert micro_batch.candidates(8, 8) == [8]


@pytest.mark.parametrize("largest_fitting", [None, 64, 32, 16, 8, 4, 2, 1])
def test_the_search_finds_the_largest_fitting_in_few_tries(largest_fitting):
    sizes = [64, 32, 16, 8, 4, 2, 1]
    tried = []

    def fits(size):
        tried.append(size)
        return largest_fitting is not None and size <= largest_fitting

    assert micro_batch.largest_fitting(sizes, fits) == largest_fitting
    assert len(tried) <= 4 and len(set(tried)) == len(tried)  # 1 + ⌈log2 6⌉, none compiled twice


def test_a_limit_between_two_candidates_picks_the_smaller(parts, capsys):
    model = parts[-1]
    two, four = forward_backward_bytes(parts, 2), forward_backward_bytes(parts, 4)
    state = state_bytes(auto_trainer(parts, 1000.0), model)  # a huge limit: the whole minibatch
    assert capsys.readouterr().err.startswith("micro-batch auto: 8 of 8 (forward+backward ")
    assert two < four
    between = (state + (two + four) / 2) / micro_batch.SAFETY / 2 ** 30
    trainer = auto_trainer(parts, between)
    assert trainer.config.algo.micro_batch_size == 2 and trainer.setup.learner.algo.micro_batch == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("micro-batch auto: 2 of 8 (forward+backward ") and "algo.micro_batch_memory_gib" in line
    # the bytes of a micro-batch of 4 (and a few for the float rounding of GiB): it fits
    assert auto_trainer(parts, (state + four + 16) / micro_batch.SAFETY / 2 ** 30).config.algo.micro_batch_size == 4


def test_a_limit_below_one_row_is_one_line_naming_the_key(parts):
    with pytest.raises(ConfigError) as err:
        auto_trainer(parts, 0.001)
    message = str(err.value)
    assert message.startswith("algo.micro_batch_size=auto: not even one row per data×fsdp shard fits "
                              "(micro-batch 1): forward+backward ")
    assert "\n" not in message and "0.9 MiB: 90% of 1.0 MiB from algo.micro_batch_memory_gib" in message


def test_without_a_limit_a_cpu_takes_the_whole_minibatch(parts, capsys):
    assert auto_trainer(parts, 0.0).config.algo.micro_batch_size == 8
    assert "the cpu backend reports no memory limit: the whole minibatch" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the run's config


def test_the_run_records_the_number_and_a_resumed_run_keeps_it(tmp_path, capsys):
    config = config_lib.load_config_file(CONFIG)
    overrides = config_lib.split_overrides(SMALL, None)
    overrides.update({"algo.micro_batch_size": "auto", "algo.micro_batch_memory_gib": "1000"})
    run = config_lib.build(config_lib.apply_overrides(config, overrides), 1)
    assert make_experiment(run).run is run  # evaluating or exporting: nothing chosen, nothing compiled
    exp = make_experiment(run, training=True)
    trainer = exp.trainer()
    chosen = trainer.config.algo.micro_batch_size
    assert chosen == 4 and exp.run.step.algo == trainer.config.algo  # SMALL's minibatch of 4, all of it
    assert run.step.algo.micro_batch_size == "auto"  # the built config itself is left as it was
    assert exp.for_training() is exp
    loop.write_config(tmp_path, exp.run)
    assert json.loads((tmp_path / "config.json").read_text())["algo"]["micro_batch_size"] == chosen
    # the same command again on the workdir (with checkpoints): the saved number, no search, no refusal
    (tmp_path / "checkpoints" / "2").mkdir(parents=True)
    resumed = loop.keep_saved_micro_batch(tmp_path, run)
    assert resumed.step.algo.micro_batch_size == chosen and resumed.values == exp.run.values
    loop.check_workdir(tmp_path, resumed)
    # another memory figure does not stop the resume either: the number is what matters
    assert "algo.micro_batch_memory_gib" in config_lib.RESUMABLE_KEYS
    assert loop.keep_saved_micro_batch(tmp_path / "fresh", run).step.algo.micro_batch_size == "auto"


def test_a_trainer_takes_a_number_only(parts):
    """The choice happens once, before the Trainer: given "auto" it refuses in one line."""
    env, params, codec, prompt, model = parts
    algo = AlgoConfig.preset("grpo", mini_batch_size=8, micro_batch_size="auto")
    with pytest.raises(ValueError, match="resolve_micro_batch"):
        Trainer(StepConfig(rollout=ROLLOUT, filter=FilterConfig(), algo=algo), model, env, params, codec, prompt)

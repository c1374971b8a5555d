"""The commands: SIGTERM and an exact resume, evaluate, export, plot of a run,
and one clear line + exit code 2 for every kind of bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ragen_jax.analysis.study_arms import study_base
from ragen_jax.cli import evaluate, export, train
from ragen_jax.diagnostics.collapse import collapse_warning
from ragen_jax.run import loop

from commands import CONFIG, ROOT, SMALL, command, command_without_torch, one_error_line, records, same_records
from xla_flags import flags_for


@pytest.fixture(scope="module")
def full_run_output(tmp_path_factory):
    """(workdir, stderr) of a 6-step run, made on a machine without PyTorch."""
    workdir = tmp_path_factory.mktemp("full")
    result = command_without_torch("ragen_jax.train", "--config", CONFIG, "--workdir", str(workdir),
                                   "--config.train.steps=6", "--config.train.save_every=3", *SMALL)
    assert result.returncode == 0, result.stderr[-2000:]
    return workdir, result.stderr


@pytest.fixture(scope="module")
def full_run(full_run_output):
    return full_run_output[0]


def test_sigterm_writes_a_checkpoint_exits_143_and_the_run_resumes_exactly(full_run, tmp_path):
    """SIGTERM mid-run: a checkpoint of the last finished step, exit 143; the same command then
    resumes and ends bitwise where an uninterrupted run ends, validations included. (SIGKILL at
    random points, while writing a checkpoint too: tests/cli/test_faults.py.)"""
    args = ["--config", CONFIG, "--workdir", str(tmp_path), "--config.train.steps=6", "--config.train.save_every=3",
            *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "ragen_jax.train", *args], cwd=ROOT, stderr=subprocess.PIPE,
                            text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-2000:]
    assert "SIGTERM" in stderr
    last = records(tmp_path)[-1]["step"]
    assert 1 <= last < 6
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())[-1] == last
    resumed = command("ragen_jax.train", *args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stderr
    want, got = records(full_run), records(tmp_path)
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4, 5, 6]  # step 0: the initial policy's validation
    assert same_records(want, got)  # bitwise: same floats, same keys (val/ at steps 0, 3 and 6 included)
    assert "val/success" in got[3] and "actor/pg_loss" in got[6]
    assert {k for k in got[0] if k != "step"} == {k for k in got[3] if k.startswith("val/")}


def test_ctrl_c_ends_with_one_line_and_exit_130(monkeypatch, capsys, tmp_path):
    """Ctrl-C while compiling or training: one line saying how to resume, no traceback."""
    def interrupted(config, workdir, devices=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "train", interrupted)
    assert train.main(["--config", CONFIG, "--workdir", str(tmp_path / "w")]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted; run the same command" in err.strip().splitlines()[-1]


def test_the_bar_after_a_resume_shows_the_latest_validation_and_mi_and_warnings_apart(tmp_path, capsys,
                                                                                        monkeypatch):
    """Also the collapse alarm after a resume: warned once (on a line of its own) while it stays
    on, and counted in the last line with the steps before the resume."""
    args = ["--config", CONFIG, "--workdir", str(tmp_path), *SMALL, "--config.train.val_every=2"]
    assert train.main([*args, "--config.train.steps=2"]) == 0
    capsys.readouterr()
    logged = records(tmp_path)
    assert [r["step"] for r in logged] == [0, 1, 2]
    # step 1's diagnostics as they would log them (they are off in these small runs); step 2 has none
    logged[1].update({"mi/first_turn/mi_zscore_ema": 1.234, "mi/collapse_alarm": 1.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    alarmed = {"mi/collapse_alarm": 1.0, "mi/first_turn/mi_zscore_ema": 0.5, "mi/collapse_peak": 2.0,
               "mi/first_turn/reasoning_token_entropy": 1.2}

    class Alarmed(loop.AlarmLog):  # the resumed steps 3 and 4 raise the alarm
        def update(self, step, metrics):
            return super().update(step, {**metrics, **alarmed} if step > 2 else metrics)

    monkeypatch.setattr(loop, "AlarmLog", Alarmed)
    assert train.main([*args, "--config.train.steps=4", "--config.logging.progress=true"]) == 0
    err = capsys.readouterr().err
    assert [r["step"] for r in records(tmp_path)] == [0, 1, 2, 3, 4]  # no second validation of step 0 or 2
    bar = [state for line in err.split("\n") for state in line.split("\r") if "4/4" in state][-1]  # the last
    assert "mi_z=1.23" in bar and "tok_ent=" in bar, bar
    assert f"val_succ={records(tmp_path)[-1]['val/success']:.2f}" in bar and "train_succ=" in bar, bar
    assert "nan" not in err
    # the warning is a line of its own, not appended to the bar's, and said once
    lines = [line.rsplit("\r", 1)[-1] for line in err.split("\n")]
    assert [line for line in lines if line.startswith("warning: step")] == [
        f"warning: step 3: {collapse_warning(alarmed)}"], err
    assert f"done: 4 steps in {tmp_path}; collapse alarm on at 3 of 3 diagnostics steps (first at step 1)" in lines


def test_early_stopping_counts_no_validation_of_the_initial_policy():
    from ragen_jax.run import config as config_lib

    config = config_lib.apply_overrides(config_lib.load_config_file(CONFIG), {
        "early_stop.val_patience": "1", "early_stop.val_success_below": "0.5"})
    settings = config_lib.build(config, 1).settings
    stopper = loop.EarlyStop(settings.early_stop, settings.diagnostics.stop_on_alarm, [{"step": 0, "val/success": 0.0}])
    assert stopper.low_validations == 0
    assert stopper.update({"val/success": 0.0}) is not None


def test_validate_at_start_false_skips_the_initial_validation(tmp_path):
    work = tmp_path / "w"
    assert train.main(["--config", CONFIG, "--workdir", str(work), *SMALL, "--config.train.steps=1",
                       "--config.train.val_every=1", "--config.train.validate_at_start=false"]) == 0
    assert [r["step"] for r in records(work)] == [1] and "val/success" in records(work)[0]


def test_evaluate_writes_results_and_trajectories(full_run, capsys, tmp_path):
    assert evaluate.main(["--workdir", str(full_run), "--episodes", "2", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "pass@2" in out and "success" in out
    result = json.loads((full_run / "eval_6.json").read_text())
    assert result["step"] == 6 and result["samples_per_env"] == 2
    assert 0.0 <= result["metrics"]["success"] <= result["metrics"]["pass@k"] <= 1.0
    assert "mi/first_turn/mi_estimate" in result["metrics"]
    assert "Turn 1" in (full_run / "eval_6_trajectories.txt").read_text()
    # Run as a command with no device count in XLA_FLAGS (the session's fast compiles kept) on a
    # run whose mesh is the default, evaluate gives the CPU one jax device per core (as train
    # does): the same episodes. Without JAX's own cache directory it keeps its compiled programs
    # in RAGEN_JAX_COMPILE_CACHE's.
    split = tmp_path / "split"
    shutil.copytree(full_run, split)
    config = json.loads((split / "config.json").read_text())
    config["mesh"]["data"] = -1
    (split / "config.json").write_text(json.dumps(config))
    cache = tmp_path / "xla_cache"
    done = command("ragen_jax.cli.evaluate", "--workdir", str(split), "--episodes", "2", "--samples", "2",
                   env={"XLA_FLAGS": flags_for(None), "JAX_COMPILATION_CACHE_DIR": "",
                        "RAGEN_JAX_COMPILE_CACHE": str(cache)})
    assert done.returncode == 0 and "one jax device per CPU core" in done.stderr, done.stderr[-2000:]
    assert any(p.name.endswith("-cache") for p in cache.iterdir())
    again = json.loads((split / "eval_6.json").read_text())["metrics"]
    for name in ("success", "pass@k", "return", "valid_action_rate"):
        assert again[name] == result["metrics"][name]
    # an older step restores too, and gives its own file
    assert evaluate.main(["--workdir", str(full_run), "--step", "3", "--episodes", "2"]) == 0
    assert (full_run / "eval_3.json").exists()


def test_export_loads_in_transformers_and_generates(full_run, tmp_path):
    import torch
    import transformers

    out = tmp_path / "hf"
    assert export.main(["--workdir", str(full_run), "--out", str(out)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("<|im_start|>user\nTurn 1:\nState:\n# # #<|im_end|>\n", return_tensors="pt")
    generated = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] == ids["input_ids"].shape[1] + 5
    # the exported weights are the checkpoint's: compare the embedding with the restored policy
    from flax import nnx

    from ragen_jax.run.experiment import restore_run

    exp, step = restore_run(full_run)
    assert step == 6
    np.testing.assert_allclose(model.model.embed_tokens.weight.detach().numpy(),
                               np.asarray(nnx.state(exp.model)["embed_tokens"][...]), atol=0)
    with torch.no_grad():
        assert torch.isfinite(model(**ids).logits).all()


LIBRARY_NOTICES = ("PyTorch was not found", "read_only", "WARNING:absl")


def test_commands_print_no_library_notices(full_run_output, tmp_path):
    """Nothing on stderr that does not concern the user: transformers' notice that PyTorch is
    absent (every command loads a tokenizer), orbax's warnings about read-only checkpoint
    managers (evaluate and export read the policy's layout); the exported files read like others."""
    workdir, trained = full_run_output
    out = tmp_path / "hf"
    exported = command_without_torch("ragen_jax.cli.export", "--workdir", str(workdir), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-2000:]
    for stderr in (trained, exported.stderr):
        assert not [line for line in stderr.splitlines() if any(n in line for n in LIBRARY_NOTICES)], stderr
    mode = lambda name: oct(os.stat(out / name).st_mode & 0o777)
    assert mode("model.safetensors") == mode("config.json")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, message", [
    (["--config", "configs/nope.py"], "config file 'configs/nope.py' does not exist"),
    (["--config", CONFIG, "--config.algo.nme=grpo"], "unknown config key 'algo.nme'"),
    (["--config", CONFIG, "--config.algo.name=sac"], "algo.name='sac'"),
    (["--config", CONFIG, "--config.rollout.group_size=many"], "--config.rollout.group_size='many': expected an integer"),
    (["--config", CONFIG, "--config.rollout.shared_env_noise=sometimes"],
     "--config.rollout.shared_env_noise='sometimes': expected true or false"),
    (["--config", CONFIG, "--config.filter.rho=-1"], "filter.rho=-1.0 must be >= 0"),
    (["--config", CONFIG, "--config.train.steps=-3"], "train.steps=-3 must be >= 1"),
    (["--config", CONFIG, "--config.rollout.action_top_k=-1"], "rollout.action_top_k=-1 must be >= 0"),
    (["--config", CONFIG, "--config.rollout.action_temperature=-0.5"],
     "rollout.action_temperature=-0.5 must be >= 0 (0: greedy actions) or None (the rollout temperature)"),
    (["--config", CONFIG, "--config.algo.name=grpo", "--config.rollout.group_size=1",
      "--config.filter.metric=reward_mean", "--config.algo.mini_batch_size=8"], "group_size must be >= 2"),
    (["--config", CONFIG, "--config.algo.mini_batch_size=48"], "algo.mini_batch_size=48 must divide"),
    (["--config", CONFIG, "--config.mesh.tensor=16"], "needs 16 devices"),
    (["--config", CONFIG, "--config.algo.weight_rounding=stochastic"],
     "algo.weight_rounding='stochastic' rounds bfloat16 weights, and model.param_dtype is 'float32'"),
    (["--config", CONFIG, "--config.env.name=Chess"], "env.name='Chess'"),
    (["--config", CONFIG, "--config.env.data_path=qa.jsonl"], "env.data_path='qa.jsonl' is only used by MathQA"),
    (["--config", CONFIG, "--config.env.success_rate=0.8"], "env.success_rate=0.8 is only used by FrozenLake"),
    (["--config", str(ROOT / "configs" / "frozenlake_tiny.py"), "--config.env.success_rate=1.5"],
     "env.success_rate=1.5 must be in [0, 1]"),
    (["--config", str(ROOT / "configs" / "mathqa_tiny.py"), "--config.env.data_path=/no/such.jsonl"],
     "QA data file '/no/such.jsonl' does not exist"),
    (["--config", str(ROOT / "configs" / "sokoban_qwen2p5_3b.py")], "model.path is required"),
    (["--config", str(ROOT / "configs" / "sokoban_qwen2p5_3b.py"), "--config.model.path=/no/such/dir"],
     "model.path='/no/such/dir': "),
    (["--config", str(ROOT / "configs" / "sokoban_qwen2p5_3b.py"), "--config.model.path=pkg:no_such_package/m.gguf"],
     "package 'no_such_package' is not installed"),
])
def test_bad_config_gives_one_line_and_exit_2(args, message, capsys, tmp_path):
    code = train.main([*args, "--workdir", str(tmp_path / "w")])
    line = one_error_line(capsys, code)
    assert message in line, line
    assert not (tmp_path / "w").exists()  # nothing written


@pytest.mark.parametrize("case", ["bad init", "holes on countdown", "negative eval-every", "uneven micro-batches"])
def test_sft_bad_input_gives_one_line_and_writes_nothing(case, capsys, tmp_path):
    from ragen_jax.cli import sft

    config, extra, message = {
        "bad init": (CONFIG, ["--init", str(tmp_path / "none")], f"model.init='{tmp_path / 'none'}'"),
        "holes on countdown": (str(ROOT / "configs" / "countdown_tiny.py"), ["--name-holes"], "only, not env Countdown"),
        "negative eval-every": (CONFIG, ["--eval-every", "-1"], "--eval-every=-1 must be >= 0"),
        "uneven micro-batches": (CONFIG, ["--batch-size", "12", "--config.algo.micro_batch_size=8",
                                          "--config.algo.mini_batch_size=16"],
                                 "--batch-size=12 must be a multiple of algo.micro_batch_size=8")}[case]
    code = sft.main(["--config", config, "--workdir", str(tmp_path / "w"), *extra])
    line = one_error_line(capsys, code)
    assert message in line, line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("flag, shown", [([], True), (["--config.logging.progress=false"], False)])
def test_sft_shows_the_fits_progress_under_trains_switch(flag, shown, monkeypatch, tmp_path):
    """`sft` asks the fit for train's progress bar under train's switch, logging.progress (on by
    default). The bar itself: tests/training/test_sft.py."""
    from ragen_jax.cli import sft

    class Stop(Exception):
        pass

    asked = []

    def fit_here(exp, config, log, progress=False, **hooks):  # the config as far as the fit, then stop
        asked.append(progress)
        raise Stop

    monkeypatch.setattr(sft, "warm_start", fit_here)
    with pytest.raises(Stop):
        sft.main(["--config", CONFIG, "--workdir", str(tmp_path / "w"), "--config.mesh.data=1", *flag])
    assert asked == [shown]


def test_a_stopped_sft_continues_from_its_checkpoint_and_refuses_other_settings(monkeypatch, tmp_path, capsys):
    """`--eval-every` validates, records and checkpoints; the same command again continues a
    stopped fit from its checkpoint (the metrics after it dropped), other settings or a train
    run's workdir are refused in one line. Bit-equal continuation: tests/training/test_sft.py."""
    from ragen_jax.cli import sft

    work = tmp_path / "fit"
    args = ["--config", CONFIG, "--workdir", str(work), "--episodes", "8", "--epochs", "2", "--batch-size", "4",
            "--eval-every", "2", "--config.eval.num_envs=2", "--config.rollout.max_turns=1",
            "--config.logging.progress=false"]

    class Stop(Exception):
        pass

    record = sft.FitRecorder.__call__

    def record_then_stop(self, step, *rest):
        record(self, step, *rest)
        if step == 2:
            (work / sft.METRICS).open("a").write(json.dumps({"step": 3, "fit_minutes": 9.0}) + "\n")  # after it
            raise Stop

    monkeypatch.setattr(sft.FitRecorder, "__call__", record_then_stop)
    with pytest.raises(Stop):
        sft.main(args)
    monkeypatch.setattr(sft.FitRecorder, "__call__", record)
    capsys.readouterr()
    assert sft.main(args) == 0
    assert "continuing the fit from step 2 of 4" in capsys.readouterr().err
    rows = [json.loads(line) for line in (work / sft.METRICS).read_text().splitlines()]
    assert [row["step"] for row in rows] == [2, 4] and rows[1]["fit_minutes"] >= rows[0]["fit_minutes"]
    assert {"success", "loss", "valid_action_rate"} <= set(rows[1])
    assert sorted(p.name for p in (work / "checkpoints").iterdir() if p.name.isdigit()) == ["4"]
    line = one_error_line(capsys, sft.main([*args, "--lr", "0.5"]))
    assert "holds a fit with other settings" in line and "sft.lr: 0.001 -> 0.5" in line, line
    trained = tmp_path / "train_run"
    (trained / "checkpoints" / "3").mkdir(parents=True)  # a train run's: no sft.json beside it
    line = one_error_line(capsys, sft.main(["--config", CONFIG, "--workdir", str(trained)]))
    assert "not a supervised fit's" in line, line


def test_a_workdir_with_another_config_is_refused(full_run, capsys):
    before = (full_run / "metrics.jsonl").read_text()
    code = train.main(["--config", CONFIG, "--workdir", str(full_run), *SMALL, "--config.algo.actor_lr=0.5"])
    line = one_error_line(capsys, code)
    assert "different config" in line and "algo.actor_lr" in line
    assert (full_run / "metrics.jsonl").read_text() == before
    code = train.main(["--config", CONFIG, "--workdir", str(full_run), *SMALL, "--config.train.resume=false"])
    assert "already has checkpoints" in one_error_line(capsys, code)


def test_evaluate_and_export_bad_input(full_run, tmp_path, capsys):
    assert "does not exist" in one_error_line(capsys, evaluate.main(["--workdir", str(tmp_path / "none")]))
    assert "no checkpoint for step 99" in one_error_line(
        capsys, evaluate.main(["--workdir", str(full_run), "--step", "99"]))
    empty = tmp_path / "run"
    empty.mkdir()
    (empty / "config.json").write_text((full_run / "config.json").read_text())
    assert "has no checkpoint" in one_error_line(capsys, evaluate.main(["--workdir", str(empty)]))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    line = one_error_line(capsys, export.main(["--workdir", str(full_run), "--out", str(taken)]))
    assert "not an empty directory" in line and (taken / "keep.txt").read_text() == "mine"
    line = one_error_line(capsys, export.main(["--workdir", str(full_run), "--out", str(tmp_path / "x"),
                                                "--adapters-only"]))
    assert "not a LoRA run" in line and not (tmp_path / "x").exists()


def test_plot_draws_a_real_run(full_run):
    from ragen_jax.cli import plot

    assert plot.main(["--workdir", str(full_run)]) == 0
    png = full_run / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_countdown_tiny_runs_a_training_step(tmp_path):
    """A text-answer env through the real model, the jitted train step and the host loop."""
    code = train.main(["--config", str(ROOT / "configs" / "countdown_tiny.py"), "--workdir", str(tmp_path), *SMALL,
                       "--config.train.steps=1", "--config.train.val_every=0", "--config.algo.name=grpo"])
    assert code == 0
    (record,) = records(tmp_path)
    assert record["step"] == 1 and record["rollout/turns"] == 1.0
    # a random model writes no valid expression: every episode is one format penalty (the tiny configs' -1.0)
    assert record["rollout/return"] == pytest.approx(-1.0) and np.isfinite(record["actor/loss"])


def test_a_config_saved_before_new_keys_existed_still_resumes():
    from ragen_jax.run import config as config_lib

    new = config_lib.default_config().to_dict()
    saved = config_lib.default_config().to_dict()
    for key in ("data_path", "data_dir", "num_records", "data_seed", "max_attempts", "success_rate"):
        saved["env"].pop(key)  # as written before MathQA and the slip key existed
    assert config_lib.differences(saved, new) == []
    new["env"]["data_path"] = "qa.jsonl"
    assert config_lib.differences(saved, new) == ["env.data_path: None -> 'qa.jsonl'"]


def test_a_config_saved_with_placeholders_for_unset_keys_still_resumes():
    """Configs saved when unset keys had placeholder values ("", 0, -1) read as None: the same
    config, and the same run."""
    from ragen_jax.run import config as config_lib

    new = config_lib.default_config().to_dict()
    saved = config_lib.default_config().to_dict()
    saved["env"].update(max_steps=0, success_rate=-1.0, data_path="", data_dir="")
    saved["model"].update(path="", init="")
    saved["rollout"].update(action_temperature=-1.0, action_top_k=0)
    saved["algo"].update(advantage="", aggregation="", dual_clip=0.0)
    assert config_lib.differences(saved, new) == []
    assert config_lib.build(config_lib.read_saved(saved), 1) == config_lib.build(new, 1)
    saved["algo"]["dual_clip"] = 2.0
    assert config_lib.differences(saved, new) == ["algo.dual_clip: 2.0 -> None"]


def test_frozenlake_default_damps_adam_and_the_study_keeps_its_setting():
    """FrozenLake's default Adam eps (docs/tuning.md) reaches the step; the study's base
    restores optax's 1e-8 and the warm start it ran from so its recorded arms (docs/results.md)
    reproduce."""
    from ragen_jax.run import config as config_lib

    config = config_lib.load_config_file(str(ROOT / "configs" / "frozenlake_tiny.py"))
    assert config_lib.build(config, 1).step.algo.adam_eps == pytest.approx(1e-3)
    study = config_lib.apply_overrides(config, study_base("frozenlake"))
    assert config_lib.build(study, 1).step.algo.adam_eps == pytest.approx(1e-8)
    assert (config.model.init, study.model.init) == ("builtin:frozenlake-tiny-noisy", "builtin:frozenlake-tiny")
    assert config.algo.adam_eps == pytest.approx(1e-3)  # overrides apply to a copy


def test_sokoban_default_decays_its_rate_and_the_study_does_not():
    """The Sokoban default's last 150 of 400 steps run at a falling rate (docs/tuning.md);
    the decay follows a shorter `train.steps`, and the recorded study, which ran at a constant
    rate (docs/results.md), keeps it."""
    from ragen_jax.run import config as config_lib

    config = config_lib.load_config_file(CONFIG)
    step = config_lib.build(config, 1).step
    assert (step.total_steps, step.algo.lr_decay_fraction * step.total_steps) == (400, 150)
    short = config_lib.build(config_lib.apply_overrides(config, {"train.steps": "6"}), 1).step
    assert short.total_steps == 6 and short.algo.lr_decay_fraction == pytest.approx(0.375)
    study = config_lib.apply_overrides(config, study_base("sokoban"))
    assert config_lib.build(study, 1).step.algo.lr_decay_fraction == 0.0


def test_action_temperature_reaches_the_rollout_and_not_validation():
    from ragen_jax.run import config as config_lib
    from ragen_jax.training.validation import EvalConfig

    config = config_lib.load_config_file(str(ROOT / "configs" / "frozenlake_tiny.py"))

    def answer(overrides):
        return config_lib.build(config_lib.apply_overrides(config, overrides), 1).step.rollout

    assert answer({}).action_sampling is None  # None: the rollout temperature for every token
    assert answer({"rollout.action_temperature": "0.5"}).action_sampling is None  # the same as rollout.temperature
    hot = answer({"rollout.action_temperature": "1.5", "rollout.top_k": "8"})
    assert (hot.action_sampling.temperature, hot.action_sampling.top_k) == (1.5, 8)
    hot = answer({"rollout.action_temperature": "2", "rollout.action_top_k": "4"})
    assert (hot.action_sampling.temperature, hot.action_sampling.top_k, hot.sampling.top_k) == (2.0, 4, 0)
    assert answer({"rollout.action_top_k": "4"}).action_sampling.temperature == 0.5  # the rollout's
    assert EvalConfig().rollout_config(hot).action_sampling is None


def test_frozenlake_slip_reaches_the_env():
    from ragen_jax.envs import registry
    from ragen_jax.run import config as config_lib

    config = config_lib.load_config_file(str(ROOT / "configs" / "frozenlake_tiny.py"))

    def slip(overrides):
        run = config_lib.build(config_lib.apply_overrides(config, overrides), 1)
        return registry.make(run.env_name, **run.env_overrides)[1].success_rate

    assert slip({}) == pytest.approx(0.8)  # the config's
    assert slip({"env.success_rate": "0.5"}) == pytest.approx(0.5)
    assert slip({"env.success_rate": "None"}) == registry.make("FrozenLake")[1].success_rate  # the preset's 1/3


def test_the_extras_the_readme_installs_exist():
    """`tensorboard --logdir` needs TensorBoard, which no required dependency installs."""
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("tensorboard") for req in extras["tensorboard"])
    readme = (ROOT / "README.md").read_text()
    named = re.findall(r'pip install -e "\.\[([\w,-]+)\]"', readme)
    assert "tensorboard" in named
    assert all(extra in extras for group in named for extra in group.split(",")), named
    (line,) = [line for line in readme.splitlines() if "tensorboard --logdir" in line]
    assert 'pip install -e ".[tensorboard]"' in line

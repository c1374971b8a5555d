"""The training loop (`python -m ragen_jax.train`): the host loop around the compiled train
step. It only logs, validates, checkpoints and decides when to stop.

Running the same command on a workdir that has checkpoints resumes from the latest one and
continues exactly (the PRNG key is part of the saved state; lines of
metrics.jsonl written after that checkpoint are dropped and recomputed). SIGTERM (preemption)
finishes the current step, writes a checkpoint and exits with code 143. A damaged latest
checkpoint (a file truncated, zeroed, deleted or changed, as preempted machines leave them) is
named in one line and moved to DIR/damaged_checkpoints/<step>, and the run resumes from the
newest one that restores (`--config.train.skip_damaged=false`: stop instead). Every error is
one line: exit code 2 for bad input (config, workdir, checkpoints), checked before any work;
1 for a write that fails during the run (a full disk), which stops it with the checkpoints
written before intact.

Writes DIR/config.json, DIR/metrics.jsonl (one JSON object per step, every train.log_every steps
and at every diagnostics step; validation metrics are
prefixed `val/`, with `val/reasoning/*` when the policy reasons in the built-in tasks' template,
`ragen_jax.diagnostics.reasoning_check`; metrics not computed at a step are absent; with validation on
(train.val_every > 0) a fresh run first validates the initial policy, logged as step 0, unless
train.validate_at_start is false),
TensorBoard event files in DIR, and orbax checkpoints in DIR/checkpoints.

The progress bar shows this step's training rollouts (`train_succ`, `return`), the filter's
`kept` ratio, the policy's mean token entropy in the update (`tok_ent`, actor/entropy), and the
latest validation success (`val_succ`) and first-turn MI-ZScore-EMA (`mi_z`), which are computed
every few steps (after a resume, the last ones logged). Warnings go on lines of their own: the
collapse alarm's (docs/method.md#the-collapse-alarm) when it starts, with a note when it clears,
and the run's last line counts the diagnostics steps it was on.

Several processes train on one mesh under `jax.distributed` (`ragen_jax.core.distributed`):
auto-detected on TPU pod slices and SLURM, or `--coordinator HOST:PORT --num-processes N
--process-id I` on each process. They share the workdir; process 0 writes the logs.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path

import jax

from ragen_jax.core import distributed
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import check_writable_dir, write_atomically
from ragen_jax.core.progress import progress_bar, tell
from ragen_jax.diagnostics import reasoning_check
from ragen_jax.diagnostics.collapse import AlarmLog
from ragen_jax.rl.algorithms import AUTO
from ragen_jax.run import config as config_lib
from ragen_jax.run.checkpoint import CheckpointError, Checkpoints
from ragen_jax.run.schema import EarlyStopSection

EXIT_FAILED, EXIT_USAGE, EXIT_PREEMPTED = 1, 2, 143


# ----------------------------------------------------------------------------- workdir


def check_workdir(workdir: Path, run: config_lib.RunConfig) -> None:
    """Refuse a workdir that is not a writable directory, or one made by a different config
    (when resuming). Writes nothing."""
    check_writable_dir(workdir, "--workdir")
    saved_path = workdir / "config.json"
    has_checkpoints = _has_checkpoints(workdir)
    if saved_path.is_file():
        try:
            saved = json.loads(saved_path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{saved_path} is not valid JSON ({err}); use a new --workdir") from None
        changes = config_lib.differences(saved, run.values)
        if changes and run.settings.train.resume and has_checkpoints:
            shown = "; ".join(changes[:4]) + (f"; … {len(changes) - 4} more" if len(changes) > 4 else "")
            raise ConfigError(f"workdir {workdir} holds a run with a different config ({shown}); use a new "
                              "--workdir, or --config.train.resume=false to ignore its checkpoints")
    if not run.settings.train.resume and has_checkpoints:
        raise ConfigError(f"workdir {workdir} already has checkpoints and train.resume=false would overwrite them; "
                          "use a new --workdir (or delete its checkpoints directory)")


def _has_checkpoints(workdir: Path) -> bool:
    return (workdir / "checkpoints").is_dir() and any((workdir / "checkpoints").iterdir())


def keep_saved_micro_batch(workdir: Path, run: config_lib.RunConfig) -> config_lib.RunConfig:
    """A run resumed with algo.micro_batch_size="auto" takes the number its config.json
    recorded, the one its checkpoints were trained with, so it resumes bit for bit on any
    device; a fresh run keeps "auto" (chosen when its `Trainer` is built)."""
    if run.settings.algo.micro_batch_size != AUTO or not run.settings.train.resume or not _has_checkpoints(workdir):
        return run
    try:
        saved = config_lib.read_saved(json.loads((workdir / "config.json").read_text()))
    except (OSError, json.JSONDecodeError, AttributeError):
        return run  # check_workdir says what is wrong with it
    number = (saved.get("algo") or {}).get("micro_batch_size", 0)  # a config saved before the key: its default
    if isinstance(number, bool) or not isinstance(number, int):
        return run
    return config_lib.with_micro_batch(run, number)


def write_config(workdir: Path, run: config_lib.RunConfig) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomically(workdir / "config.json", config_lib.to_json(run.values))


class MetricsLog:
    """metrics.jsonl (+ TensorBoard, + Weights & Biases when enabled and installed)."""

    def __init__(self, workdir: Path, run: config_lib.RunConfig, resume_step: int):
        self.path = workdir / "metrics.jsonl"
        self.history = self._truncate(resume_step)
        self.file = self.path.open("a")
        self.tensorboard = None
        logging = run.settings.logging
        if logging.tensorboard:
            from tensorboardX import SummaryWriter

            self.tensorboard = SummaryWriter(str(workdir), purge_step=resume_step + 1 if resume_step else None)
        self.wandb = None
        if logging.wandb:
            try:
                import wandb
            except ImportError:
                print("note: logging.wandb=true but wandb is not installed (pip install wandb); skipping it",
                      file=sys.stderr)
            else:
                self.wandb = wandb.init(project=logging.wandb_project, config=run.values,
                                        dir=str(workdir), id=_run_id(workdir), resume="allow")

    def _truncate(self, resume_step: int) -> list[dict]:
        """Keep the lines up to the resumed step (later ones are recomputed; a fresh run, step 0,
        keeps none) and return them."""
        if not self.path.exists():
            return []
        kept = read_history(self.path, resume_step)
        write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        return kept

    def write(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: v for k, v in metrics.items() if math.isfinite(v)}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            for key, value in record.items():
                if key != "step":
                    self.tensorboard.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def close(self) -> None:
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_history(path: Path, resume_step: int) -> list[dict]:
    """The records of metrics.jsonl up to the resumed step, none for a fresh run (the same
    before and after `MetricsLog` truncates the file, so processes other than 0 may read it at
    any time)."""
    if not resume_step or not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut by a crash: everything after it is recomputed
        if record.get("step", math.inf) <= resume_step:
            kept.append(record)
    return kept


def _run_id(workdir: Path) -> str:
    import hashlib

    return hashlib.sha1(str(workdir.absolute()).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- early stopping


class EarlyStop:
    """The reference implementation's stop rules, each switchable (0 = off). Its counters are
    rebuilt from the metrics history on resume, so a resumed run stops where the original would.
    Only steps that trained count: the initial policy's validation (step 0) is no evidence of a
    stuck run."""

    def __init__(self, rules: EarlyStopSection, stop_on_alarm: bool, history: list[dict]):
        self.rules = rules
        self.stop_on_alarm = stop_on_alarm
        self.collapsed_steps = 0
        self.low_validations = 0
        for record in history:
            if record["step"] > 0:
                self.update(record)

    def update(self, m: dict) -> str | None:
        r = self.rules
        if r.empty_batches and m.get("filter/empty_streak", 0) >= r.empty_batches:
            return f"the filter kept no group for {r.empty_batches} steps in a row"
        if "filter/in_group_reward_std_max" in m:
            collapsed = m["filter/in_group_reward_std_max"] <= 1e-8
            self.collapsed_steps = self.collapsed_steps + 1 if collapsed else 0
        if r.reward_std_collapse and self.collapsed_steps >= r.reward_std_collapse:
            return f"every group's reward std was 0 for {r.reward_std_collapse} steps in a row"
        if "val/success" in m:
            self.low_validations = self.low_validations + 1 if m["val/success"] < r.val_success_below else 0
        if r.val_patience and self.low_validations >= r.val_patience:
            return f"validation success stayed below {r.val_success_below} for {r.val_patience} validations"
        if self.stop_on_alarm and m.get("mi/collapse_alarm", 0) >= 1:
            return "the template-collapse alarm fired (diagnostics.stop_on_alarm)"
        return None


# ----------------------------------------------------------------------------- the loop


MI_ZSCORE, VAL_SUCCESS = "mi/first_turn/mi_zscore_ema", "val/success"


def progress_line(m: dict, latest: dict) -> dict:
    """The bar's fields: this step's metrics `m`, and the `latest` validation success and
    MI-ZScore-EMA (not computed every step). A value not known (yet) is left out, not shown as nan."""
    fields = {"train_succ": (m.get("rollout/success"), ".2f"), "val_succ": (latest.get(VAL_SUCCESS), ".2f"),
              "return": (m.get("rollout/return"), ".2f"), "kept": (m.get("filter/kept_ratio"), ".2f"),
              "mi_z": (latest.get(MI_ZSCORE), ".2f"), "tok_ent": (m.get("actor/entropy"), ".3f")}
    return {name: format(value, spec) for name, (value, spec) in fields.items()
            if value is not None and math.isfinite(value)}


def latest_values(records: list[dict], latest: dict | None = None) -> dict:
    """The last finite value of each metric the bar keeps (MI-ZScore-EMA, validation success) in
    `records`, or in `latest` where `records` have none."""
    latest = dict(latest or {})
    for record in records:
        latest.update({k: record[k] for k in (MI_ZSCORE, VAL_SUCCESS) if math.isfinite(record.get(k, math.nan))})
    return latest


def validation_metrics(validator, policy, exp) -> dict:
    """`val/` metrics of `policy`. Validation draws its keys from eval.seed only, so it leaves
    the training's PRNG key (and an exact resume) alone."""
    val, val_traj = validator(policy)
    # the built-in tasks' reasoning template, checked against the boards ({} for free-form reasoning)
    val_traj = distributed.to_host(val_traj)
    val.update(reasoning_check.validation_metrics(val_traj, exp.tokenizer, exp.env, exp.env_params))
    return {f"val/{k}": float(v) for k, v in val.items()}


def train(config, workdir: Path, devices=None) -> int:
    from ragen_jax.run.experiment import make_experiment

    run = config_lib.build(config, len(devices or jax.devices()))  # validate before anything heavy
    run = keep_saved_micro_batch(workdir, run)
    check_workdir(workdir, run)
    # loads the model (bad paths fail before any write) and chooses an "auto" micro-batch
    exp = make_experiment(run, devices, training=True)
    run = exp.run  # the config the step compiles with and config.json records
    lead = distributed.is_lead()  # process 0 writes config, logs and messages
    trainer = exp.trainer()
    train_settings = run.settings.train
    m = run.settings.model  # a LoRA run's checkpoints name the base they belong to
    checkpoints = Checkpoints(workdir, keep=train_settings.keep_checkpoints,
                              base={"model.path": m.path, "model.init": m.init, "model.preset": m.preset})
    try:
        state = trainer.init_state(jax.random.key(run.settings.seed), exp.model)
        start = 0
        if train_settings.resume and checkpoints.steps():
            start, state = resume(checkpoints, state, train_settings.skip_damaged)
            if lead:
                print(f"resuming {workdir} from step {start}", file=sys.stderr)
        if lead:  # after the restore: a refused resume leaves the workdir as it was
            write_config(workdir, run)
        return _loop(run, workdir, exp, trainer, checkpoints, state, start)
    finally:
        checkpoints.close()  # also after an error: orbax's threads must not outlive the run


def resume(checkpoints: Checkpoints, state, skip_damaged: bool):
    """(step, state) of the newest checkpoint that restores. Newer ones that do not are damaged
    (an older one of the same run restores): each is named in one line and moved aside. With
    `skip_damaged` false the newest must restore."""
    if not skip_damaged:
        step = checkpoints.latest_step()
        try:
            return step, checkpoints.restore(step, state)
        except CheckpointError as err:
            raise CheckpointError(f"{err} (train.skip_damaged=false: not resuming from an older checkpoint)") from None
    step, state, damaged = checkpoints.restore_newest(lambda s: checkpoints.restore(s, state))
    for bad, err in damaged:
        moved = checkpoints.set_aside(bad)
        if distributed.is_lead():
            print(f"warning: {err}; moved it to {moved}", file=sys.stderr)
    return step, state


def _loop(run: config_lib.RunConfig, workdir: Path, exp, trainer, checkpoints: Checkpoints, state,
          start: int) -> int:
    from ragen_jax.training.validation import Validator

    lead = distributed.is_lead()
    settings = run.settings
    log = MetricsLog(workdir, run, start) if lead else None
    history = log.history if lead else read_history(workdir / "metrics.jsonl", start)
    stopper = EarlyStop(settings.early_stop, settings.diagnostics.stop_on_alarm, history)
    alarms = AlarmLog(history)
    latest = latest_values(history)
    validator = None
    if settings.train.val_every:
        validator = Validator(exp.model, exp.env, exp.env_params, exp.codec, exp.prompt, settings.eval,
                              run.step.rollout, exp.mesh)

    preempted = []
    previous = signal.signal(signal.SIGTERM, lambda *_: preempted.append(True))
    steps = settings.train.steps
    bar = None
    if settings.logging.progress and lead:
        bar = progress_bar(steps, "train", initial=start)
    reason, step = None, start
    try:
        if validator is not None and start == 0 and settings.train.validate_at_start:  # the initial policy
            initial = validation_metrics(validator, state.policy, exp)
            if lead:
                log.write(0, initial)
            latest = latest_values([initial], latest)
            if bar is not None:
                bar.set_postfix(progress_line({}, latest))
        for step in range(start + 1, steps + 1):
            started = time.perf_counter()
            state, metrics = trainer.step(state)
            metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
            metrics["time/step_seconds"] = time.perf_counter() - started
            if validator is not None and (step % settings.train.val_every == 0 or step == steps):
                metrics.update(validation_metrics(validator, state.policy, exp))
            diagnosed = math.isfinite(metrics.get("mi/collapse_alarm", math.nan))  # logged whatever log_every
            if lead and (step % settings.train.log_every == 0 or step == steps or diagnosed):
                log.write(step, metrics)
            latest = latest_values([metrics], latest)
            alarm_line = alarms.update(step, metrics)  # when the collapse alarm starts or clears
            if lead and alarm_line:
                tell(f"{'warning' if alarms.on else 'note'}: step {step}: {alarm_line}", bar)
            if bar is not None:
                bar.set_postfix(progress_line(metrics, latest), refresh=False)
                bar.update(1)
            reason = stopper.update(metrics)  # the same metrics on every process: the same decision
            if distributed.any_process(bool(preempted)):  # a signal may reach only some processes
                reason = "SIGTERM"
            checkpoints.poll()  # a save that failed in the background stops the run here
            if step % settings.train.save_every == 0 or step == steps or reason:
                checkpoints.save(state, force=True)
            if reason:
                break
        checkpoints.settle()  # the last checkpoint is complete before the run says it is done
    finally:
        if log is not None:
            log.close()
        if bar is not None:
            bar.close()
        signal.signal(signal.SIGTERM, previous)
    if not lead:
        return EXIT_PREEMPTED if reason == "SIGTERM" else 0
    if reason == "SIGTERM":
        print(f"stopped by SIGTERM after step {step}; checkpoint saved — run the same command to resume",
              file=sys.stderr)
        return EXIT_PREEMPTED
    if reason:
        print(f"early stop after step {step}: {reason}", file=sys.stderr)
    print(f"done: {step} steps in {workdir}{alarms.summary()}", file=sys.stderr)
    return 0

"""Running the commands in the tests: as subprocesses (a real exit: its stderr, its exit code,
what it leaves on disk) on the tiny config at small shapes, and reading what they wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "sokoban_tiny.py")
# Tiny and quick to compile; no early stop (a random policy only earns format penalties) and
# no filtering, so every step updates the weights and the resumed numbers depend on them. A
# constant learning rate: with the tiny config's decay the run's length is part of the compiled
# step, and runs of other lengths would each compile their own (the decay's own tests:
# tests/training/test_step.py).
SMALL = ["--config.rollout.num_groups=2", "--config.rollout.group_size=2", "--config.rollout.max_turns=1",
         "--config.rollout.max_new_tokens=8", "--config.algo.mini_batch_size=4", "--config.filter.strategy=none",
         "--config.diagnostics.enabled=false", "--config.early_stop.empty_batches=0",
         "--config.early_stop.reward_std_collapse=0", "--config.eval.num_envs=2", "--config.train.val_every=3",
         "--config.mesh.data=1", "--config.logging.progress=false", "--config.algo.lr_decay_fraction=0"]


def command(module, *args, env=None):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=600)


def command_without_torch(module, *args):
    """`command` as on a machine without PyTorch (which this package does not need): `import
    torch` fails and transformers finds no torch."""
    code = (f"import runpy, sys; sys.modules['torch'] = None; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def start(module, *args):
    """The command as a running process (to be killed), its output discarded."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def records(workdir):
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def same_records(want, got):
    """Bitwise the same metrics (same floats, same keys), apart from the step's wall time."""
    strip = lambda rs: [{k: v for k, v in r.items() if k != "time/step_seconds"} for r in rs]
    return strip(want) == strip(got)


def one_error_line(capsys, code, expected_code=2):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == expected_code
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]

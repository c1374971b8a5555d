"""Two processes on one mesh (jax.distributed over the loopback, gloo CPU collectives) train
exactly like one process with two devices: same metrics, same parameters."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "sokoban_tiny.py")
STEPS = 2
# The tiny config at small shapes, no validation (a second compile per process: the suite's budget).
ARGS = ["--config", CONFIG, f"--config.train.steps={STEPS}", "--config.rollout.num_groups=2",
        "--config.rollout.group_size=2", "--config.rollout.max_turns=1", "--config.rollout.max_new_tokens=8",
        "--config.algo.mini_batch_size=4", "--config.filter.strategy=none", "--config.diagnostics.enabled=false",
        "--config.early_stop.empty_batches=0", "--config.early_stop.reward_std_collapse=0",
        "--config.train.val_every=0", "--config.mesh.data=2",
        "--config.logging.progress=false", "--config.logging.tensorboard=false"]


def environment(devices: int) -> dict:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir, devices, *extra):
    return subprocess.Popen([sys.executable, "-m", "ragen_jax.train", *ARGS, "--workdir", str(workdir), *extra],
                            cwd=ROOT, env=environment(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc):
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, err


def records(workdir):
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def policy(workdir):
    from flax import nnx

    from ragen_jax.checkpoint import Checkpoints
    from ragen_jax.models.qwen2 import Qwen2, Qwen2Config

    like = nnx.state(nnx.eval_shape(lambda: Qwen2(Qwen2Config.preset("tiny"), rngs=nnx.Rngs(0))))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
    restored = Checkpoints(workdir, read_only=True).restore_policy(STEPS, like)
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(restored)])


def test_two_processes_train_like_one_process_with_two_devices(tmp_path):
    if "jax_cpu_collectives_implementation" not in jax.config.values:
        pytest.skip(f"jax {jax.__version__} has no jax_cpu_collectives_implementation option: no cross-process "
                    "CPU collectives (gloo) to run two processes on one mesh")
    port = free_port()
    multi = [start(tmp_path / "multi", 1, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                   "--process-id", str(i)) for i in range(2)]
    single = start(tmp_path / "single", 2)
    results = [finish(p) for p in (*multi, single)]
    for code, err in results:
        assert code == 0, err[-3000:]
    assert "done: 2 steps" in results[0][1] and "done" not in results[1][1]  # process 0 reports, 1 does not

    got, want = records(tmp_path / "multi"), records(tmp_path / "single")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for a, b in zip(got, want):
        a.pop("time/step_seconds"), b.pop("time/step_seconds")
        assert a.keys() == b.keys()
        for name in b:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert "actor/pg_loss" in got[-1]

    multi_params, single_params = policy(tmp_path / "multi"), policy(tmp_path / "single")
    assert np.abs(multi_params - single_params).max() <= 1e-5

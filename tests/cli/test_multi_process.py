"""Two processes on one mesh (jax.distributed over the loopback, gloo CPU collectives) train,
evaluate and export exactly like one process with two devices: same metrics, same parameters."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from xla_flags import flags_for

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
    env = {**os.environ, "XLA_FLAGS": flags_for(devices), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command, args, devices, *extra):
    return subprocess.Popen([sys.executable, "-m", f"ragen_jax.{command}", *args, *extra],
                            cwd=ROOT, env=environment(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc, with_stdout=False):
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return (proc.returncode, out, err) if with_stdout else (proc.returncode, err)


def records(workdir):
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def policy(workdir):
    from flax import nnx

    from ragen_jax.models.config import DecoderConfig
    from ragen_jax.models.decoder import Decoder
    from ragen_jax.run.checkpoint import Checkpoints

    like = nnx.state(nnx.eval_shape(lambda: Decoder(DecoderConfig.preset("tiny"), rngs=nnx.Rngs(0))))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
    restored = Checkpoints(workdir, read_only=True).restore_policy(STEPS, like)
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(restored)])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two train steps by two processes (one device each) and by one process with two devices."""
    if "jax_cpu_collectives_implementation" not in jax.config.values:
        pytest.skip(f"jax {jax.__version__} has no jax_cpu_collectives_implementation option: no cross-process "
                    "CPU collectives (gloo) to run two processes on one mesh")
    root = tmp_path_factory.mktemp("multi_process")
    port = free_port()
    multi = [start("train", ARGS + ["--workdir", str(root / "multi")], 1, *coordinator(port, i)) for i in range(2)]
    single = start("train", ARGS + ["--workdir", str(root / "single")], 2)
    return root, [finish(p) for p in (*multi, single)]


def coordinator(port, process_id):
    return ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(process_id)]


def test_two_processes_train_like_one_process_with_two_devices(trained):
    root, results = trained
    for code, err in results:
        assert code == 0, err[-3000:]
    assert "done: 2 steps" in results[0][1] and "done" not in results[1][1]  # process 0 reports, 1 does not

    got, want = records(root / "multi"), records(root / "single")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for a, b in zip(got, want):
        a.pop("time/step_seconds"), b.pop("time/step_seconds")
        assert a.keys() == b.keys()
        for name in b:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert "actor/pg_loss" in got[-1]

    multi_params, single_params = policy(root / "multi"), policy(root / "single")
    assert np.abs(multi_params - single_params).max() <= 1e-5


def test_two_processes_evaluate_and_export_like_one(trained):
    """The same checkpoint evaluated by two processes and by one process gives the same numbers;
    two processes export the same tensors the checkpoint holds; only process 0 writes."""
    from safetensors.numpy import load_file

    root, results = trained
    if any(code != 0 for code, _ in results):
        pytest.skip("training failed (reported by the training test)")
    import shutil

    shutil.copytree(root / "multi", root / "copy")
    port, export_port = free_port(), free_port()
    evaluate = ["--episodes", "4"]
    procs = [start("evaluate", ["--workdir", str(root / "multi"), *evaluate], 1, *coordinator(port, i))
             for i in range(2)]
    procs.append(start("evaluate", ["--workdir", str(root / "copy"), *evaluate], 2))
    procs += [start("export", ["--workdir", str(root / "multi"), "--out", str(root / "hf")], 1,
                    *coordinator(export_port, i)) for i in range(2)]
    outs = [finish(p, with_stdout=True) for p in procs]
    for code, out, err in outs:
        assert code == 0, err[-3000:]
    # process 0 prints, 1 does not (gloo's own connection message aside)
    assert "success" in outs[0][1] and "success" not in outs[1][1]
    assert "exported" in outs[3][1] and "exported" not in outs[4][1]

    got = json.loads((root / "multi" / f"eval_{STEPS}.json").read_text())
    want = json.loads((root / "copy" / f"eval_{STEPS}.json").read_text())
    assert got["episodes"] == want["episodes"] == 4
    assert got["metrics"].keys() == want["metrics"].keys()
    for name in want["metrics"]:
        np.testing.assert_allclose(got["metrics"][name], want["metrics"][name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert (root / "multi" / f"eval_{STEPS}_trajectories.txt").read_text() == \
        (root / "copy" / f"eval_{STEPS}_trajectories.txt").read_text()

    tensors = load_file(str(root / "hf" / "model.safetensors"))
    exported = sum(int(t.size) for t in tensors.values())
    params = policy(root / "multi")
    assert exported == params.size  # tied embeddings: one tensor each, nothing missing or doubled
    assert np.isclose(sum(float(np.asarray(t, np.float64).sum()) for t in tensors.values()), params.sum(), rtol=1e-6)
    assert not list((root / "hf").glob("*.partial"))

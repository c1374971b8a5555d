"""One jax device per CPU core for the train command: how many devices, and when none are set."""

import ml_collections
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen_jax.core import host_devices
from ragen_jax.run.config import default_config


@given(st.integers(1, 16), st.lists(st.integers(1, 512), min_size=1, max_size=3))
def test_device_count_is_the_most_devices_that_split_every_row_count(cores, rows):
    count = host_devices.device_count(cores, tuple(rows))
    assert 1 <= count <= cores and all(r % count == 0 for r in rows)
    assert not any(all(r % d == 0 for r in rows) for d in range(count + 1, cores + 1))


def config(**mesh) -> ml_collections.ConfigDict:
    c = default_config()  # 8 x 16 rollout rows, minibatches of 32, mesh data=-1
    c.mesh.update(mesh)
    return c


@pytest.mark.parametrize("cores, want", [(2, 2), (6, 4), (8, 8), (64, 32), (1, None)])
def test_split_host_sets_one_device_per_core_that_divides_the_rows(monkeypatch, cores, want):
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert host_devices.split_host(config(), cores=cores) == want
    expected = "--xla_backend_optimization_level=0"
    if want:
        expected += f" --xla_force_host_platform_device_count={want}"
    assert host_devices.os.environ["XLA_FLAGS"] == expected


@pytest.mark.parametrize("flags, mesh", [
    ("--xla_force_host_platform_device_count=1", {}),  # the user's count wins
    ("", {"data": 1}),  # a mesh the config fixed
    ("", {"data": 1, "fsdp": -1}),
])
def test_split_host_leaves_a_given_count_or_mesh_alone(monkeypatch, flags, mesh):
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert host_devices.split_host(config(**mesh), cores=8) is None
    assert host_devices.os.environ["XLA_FLAGS"] == flags


def test_evaluate_splits_for_the_validation_rows_of_the_saved_config(monkeypatch, tmp_path):
    from ragen_jax.cli import evaluate
    from ragen_jax.run.config import to_json

    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setattr(host_devices.os, "cpu_count", lambda: 8)
    saved = config()
    saved.eval.update(num_envs=6, samples_per_env=1)
    (tmp_path / "config.json").write_text(to_json(saved))
    assert evaluate.split_host(tmp_path, None, None) == 6  # 6 levels x 1 sample
    monkeypatch.setenv("XLA_FLAGS", "")
    assert evaluate.split_host(tmp_path, 4, 2) == 8  # --episodes 4 --samples 2
    monkeypatch.setenv("XLA_FLAGS", "")
    assert evaluate.split_host(tmp_path / "missing", None, None) is None  # evaluate reports it
    assert host_devices.os.environ["XLA_FLAGS"] == ""

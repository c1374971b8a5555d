"""A command started as a program: transformers and tensorboardX work without PyTorch, which is
installed here (a test dependency) and never imported, and nothing is said about it."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from commands import ROOT
from ragen_jax.core import quiet

PROGRAM = textwrap.dedent("""
    import sys
    from ragen_jax.core import quiet

    def main():
        quiet.commands()
        from ragen_jax.models.hf import load_tokenizer
        import tensorboardX
        assert load_tokenizer().decode(load_tokenizer().encode("hello world")) == "hello world"
        print(sys.modules["torch"] is None, hasattr(tensorboardX, "SummaryWriter"))
        return 3

    sys.exit(quiet.run_program(main))
""")


def test_a_command_started_as_a_program_never_imports_pytorch():
    assert importlib.util.find_spec("torch") is not None  # installed: only run_program keeps it out
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 3, result.stderr  # main's exit code
    assert result.stdout.split() == ["True", "True"]
    assert result.stderr == ""


LIBTPU = importlib.util.find_spec("libtpu") is not None


def fake_machine(tmp_path, vendors=(), dev_files=()):
    """A /sys/bus/pci/devices with one device per vendor id, and a /dev with `dev_files`."""
    pci, dev = tmp_path / "pci", tmp_path / "dev"
    pci.mkdir()
    dev.mkdir()
    for i, vendor in enumerate(vendors):
        (pci / f"0000:00:0{i}.0").mkdir()
        (pci / f"0000:00:0{i}.0" / "vendor").write_text(vendor + "\n")
    for name in dev_files:
        (dev / name).write_text("")
    return pci, dev


@pytest.mark.skipif(not LIBTPU, reason="libtpu is not installed (the tpu extra)")
@pytest.mark.parametrize("vendors, dev_files, environ, skipped", [
    (("0x8086", "0x1af4"), (), {}, True),  # a CPU machine: the probe is skipped
    (("0x8086", "0x1ae0"), (), {}, False),  # a TPU chip on the bus
    (("0x8086",), ("nvidiactl",), {}, False),  # an NVIDIA GPU: its plugin decides
    (("0x8086",), ("kfd",), {}, False),  # an AMD GPU
    (("0x8086",), (), {"JAX_PLATFORMS": "tpu"}, False),  # the user's choice wins
])
def test_the_tpu_probe_is_skipped_only_without_any_accelerator(tmp_path, vendors, dev_files, environ, skipped):
    pci, dev = fake_machine(tmp_path, vendors, dev_files)
    before = dict(environ)
    assert quiet.skip_absent_tpu(environ, pci, dev) is skipped
    assert environ == ({**before, "JAX_PLATFORMS": "cpu"} if skipped else before)


def test_without_libtpu_nothing_changes(tmp_path, monkeypatch):
    pci, dev = fake_machine(tmp_path, ("0x8086",))
    monkeypatch.setattr(quiet.importlib.util, "find_spec", lambda name: None)
    environ = {}
    assert not quiet.skip_absent_tpu(environ, pci, dev) and environ == {}


@pytest.mark.skipif(not LIBTPU, reason="libtpu is not installed (the tpu extra)")
def test_with_libtpu_installed_a_command_on_a_cpu_machine_prints_nothing_more():
    """jax imported before `commands()` (as the commands' modules do), no TPU attached here: the
    first device query finds the CPU and libtpu says nothing."""
    if quiet.tpu_attached() or quiet.gpu_attached():
        pytest.skip("an accelerator is attached")
    program = textwrap.dedent("""
        import jax
        from ragen_jax.core import quiet
        quiet.commands()
        print(jax.devices()[0].platform)
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu"]
    assert result.stderr == ""

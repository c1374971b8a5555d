"""A command started as a program: transformers and tensorboardX work without PyTorch, which is
installed here (a test dependency) and never imported, and nothing is said about it."""

import importlib.util
import subprocess
import sys
import textwrap

from commands import ROOT

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

"""The commands' persistent compilation cache: where it goes, off, JAX's own setting first, and
an unwritable directory reported in one line instead of a warning per program."""

import os
import subprocess
import sys
from pathlib import Path

from ragen_jax.core import compile_cache

ROOT = Path(__file__).resolve().parents[2]


def test_cache_dir_from_the_environment(tmp_path):
    assert compile_cache.cache_dir({compile_cache.ENV: str(tmp_path / "c")}) == tmp_path / "c"
    assert compile_cache.cache_dir({compile_cache.ENV: "~/xla"}) == Path.home() / "xla"
    for off in ("off", "OFF", "0", "false", ""):
        assert compile_cache.cache_dir({compile_cache.ENV: off}) is None
    assert compile_cache.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "ragen_jax" / "jax"
    assert compile_cache.cache_dir({}) == Path.home() / ".cache" / "ragen_jax" / "jax"


def test_jax_own_cache_directory_is_kept():
    """The test session sets JAX_COMPILATION_CACHE_DIR (tests/conftest.py): it stays in use."""
    import jax

    before = jax.config.jax_compilation_cache_dir
    assert before and compile_cache.enable({compile_cache.ENV: "/elsewhere"}) == Path(before)
    assert jax.config.jax_compilation_cache_dir == before


def enable_in_a_fresh_process(cache_env: str):
    """enable() in a Python without JAX_COMPILATION_CACHE_DIR, then one jitted call: (stdout
    lines, stderr)."""
    code = ("import jax, jax.numpy as jnp\n"
            "from ragen_jax.core import compile_cache\n"
            "print(compile_cache.enable())\n"
            "print(jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)).tolist())\n"
            "print(jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size)\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env[compile_cache.ENV] = cache_env
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # write every program
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines(), done.stderr


def test_enable_writes_compiled_programs_to_the_directory(tmp_path):
    where = tmp_path / "cache"
    out, _ = enable_in_a_fresh_process(str(where))
    assert out == [str(where), "[1.0, 3.0, 5.0]", f"{where} {compile_cache.MAX_BYTES}"]
    assert any(p.name.endswith("-cache") for p in where.iterdir())


def test_off_and_an_unwritable_directory_leave_jax_without_a_cache(tmp_path):
    out, err = enable_in_a_fresh_process("off")
    assert out == ["None", "[1.0, 3.0, 5.0]", "None -1"] and "compilation cache" not in err
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    out, err = enable_in_a_fresh_process(str(blocked / "cache"))
    assert out == ["None", "[1.0, 3.0, 5.0]", "None -1"]
    lines = [line for line in err.splitlines() if "compilation cache" in line]
    assert len(lines) == 1 and f"{compile_cache.ENV}={blocked / 'cache'}" in lines[0], err

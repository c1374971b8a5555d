"""Test-session setup: 8 fake CPU devices so sharding tests run in the same process, fast
XLA compiles, a shared compilation cache, deterministic property tests."""

import os
import tempfile

from xla_flags import session_flags

# 8 fake devices, and fast compiles (tests/xla_flags.py says why)
os.environ.setdefault("XLA_FLAGS", session_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA compilation cache per test session, inherited by subprocesses: the command-line and
# notebook tests start fresh Python processes that would compile the same train step again.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="ragen_jax_xla_cache_"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (CI included), so a red run is
# reproducible. Explore new examples with `HYPOTHESIS_PROFILE=explore python -m pytest`.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


# The slowest files start first: with two workers and one file per worker (--dist loadfile),
# a slow file collected last would run alone at the end while the other worker idles.
SLOW_FIRST = ("analysis/test_study.py", "cli/test_multi_process.py", "notebooks/test_notebooks.py",
              "cli/test_train_cli.py", "cli/test_faults.py", "core/test_sharding.py", "training/test_step.py",
              "cli/test_lora_cli.py", "training/test_lora_step.py", "analysis/test_tpu_plan.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return next((i for i, name in enumerate(SLOW_FIRST) if path.endswith(name)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: the order inside a file and among the rest is kept

"""Test-session setup: 8 fake CPU devices so sharding tests run in the same process."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
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

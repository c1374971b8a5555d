"""Test-session setup: 8 fake CPU devices so sharding tests run in the same process."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (CI included), so a red run is
# reproducible. Explore new examples with `HYPOTHESIS_PROFILE=explore python -m pytest`.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

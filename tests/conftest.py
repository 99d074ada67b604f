"""Test-wide setup: CPU only, 8 fake XLA devices for sharding tests (must run before JAX is imported)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("SERA_JAX_COMPILATION_CACHE", "0")  # tests compile afresh; CLI runs reuse ~/.cache

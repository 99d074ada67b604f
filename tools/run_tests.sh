#!/usr/bin/env bash
# The test command of README.md: the import-layer contract and ruff, then the whole suite on CPU, with 8 fake devices for
# the sharding tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8"
export JAX_PLATFORMS=cpu
export TOKENIZERS_PARALLELISM=false
# The layering contract (pyproject.toml [tool.importlinter]): an upward import between rooms fails here, first.
lint-imports
# The lint ([tool.ruff] in pyproject.toml): pyflakes and blind excepts; every noqa names a rule that fires.
ruff check --quiet .
exec python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=25 tests "$@"

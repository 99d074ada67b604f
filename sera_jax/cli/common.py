"""What every command shares: the default config, and loading a config or reporting its error."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from sera_jax.config import ConfigError, RunConfig, load_config, split_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
CONFIG_ERROR = 2  # the exit status of a command whose config does not load


def load_or_report(args: Sequence[str], *, check_paths: bool = True) -> RunConfig | None:
    """Returns the RunConfig of ``args`` (YAML files, then ``a.b=c`` overrides; the tiny CPU default when no file is
    given), or None after printing ``config error: …`` (naming the key) to stderr."""
    paths, overrides = split_cli(list(args))
    try:
        return load_config(paths or [str(DEFAULT_CONFIG)], overrides, check_paths=check_paths)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return None

"""What every command shares: the default config, and loading a config or reporting its error."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator, Sequence

from sera_jax.config import ConfigError, RunConfig, UserError, load_config, split_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
CONFIG_ERROR = 2  # the exit status of a command whose config does not load
USER_ERROR = 2  # the exit status of a command stopped by a user's mistake (UserError)


def report_user_error(prog: str, e: UserError) -> int:
    """Prints ``prog: error: …`` (the error's one-line message) to stderr; returns the exit status, 2."""
    print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
    return USER_ERROR


def missing_path(path: str | Path, what: str) -> UserError | None:
    """Returns a ``UserError`` when ``path`` does not exist (``no WHAT at PATH``), else None."""
    return None if Path(path).exists() else UserError(f"no {what} at {path}")


@contextlib.contextmanager
def no_empty_folder(path: str | Path) -> Iterator[None]:
    """Runs the block; a folder ``path`` that the block created and left without any file (a command stopped by an
    error before its first output) is removed on the way out."""
    path = Path(path)
    existed = path.exists()
    try:
        yield
    finally:
        if not existed and path.is_dir() and not any(files for _, _, files in os.walk(path)):
            shutil.rmtree(path, ignore_errors=True)


def load_or_report(args: Sequence[str], *, check_paths: bool = True) -> RunConfig | None:
    """Returns the RunConfig of ``args`` (YAML files, then ``a.b=c`` overrides; the tiny CPU default when no file is
    given), or None after printing ``config error: …`` (naming the key) to stderr. A config with
    ``engine.backend: simulated`` installs its simulated device (``cli/simulate.py``)."""
    from sera_jax.cli.simulate import install_for

    paths, overrides = split_cli(list(args))
    try:
        cfg = load_config(paths or [str(DEFAULT_CONFIG)], overrides, check_paths=check_paths)
        install_for(cfg)  # engine.backend: simulated (--simulate GPU): the simulated device, before any engine
        return cfg
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return None


def start_processes(prog: str) -> bool:
    """Starts a multi-host job's distributed runtime when the environment names one (``SERA_COORDINATOR``,
    ``SERA_NUM_PROCESSES``, ``SERA_PROCESS_ID``); returns False after printing ``error: …`` when it cannot.
    Call it first: nothing may touch the XLA backend before it."""
    from sera_jax.parallel.hosts import DistributedError, start_distributed

    try:
        start_distributed()
    except DistributedError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return False
    return True


def end_processes() -> None:
    """Ends a multi-host job's runtime in order at a command's end (every process waits for the others, then shuts
    down); nothing for one process."""
    import jax

    if jax.process_count() > 1:
        from sera_jax.parallel.hosts import finish_distributed

        finish_distributed()


def one_process_only(prog: str, why: str) -> bool:
    """Returns False after printing ``error: …`` when the environment names a multi-process job, which ``prog``
    does not run as (``why``); the run directory it writes is what every host of a training job then reads."""
    from sera_jax.parallel.hosts import distributed_settings

    try:
        multi = distributed_settings() is not None
    except Exception as e:  # noqa: BLE001 - DistributedError: a malformed setting is reported the same way
        print(f"{prog}: error: {e}", file=sys.stderr)
        return False
    if multi:
        print(f"{prog}: error: runs as one process ({why}); unset SERA_COORDINATOR / SERA_NUM_PROCESSES / "
              "SERA_PROCESS_ID, run it on one host, and give the training job its run directory", file=sys.stderr)
        return False
    return True


def use_compilation_cache() -> str | None:
    """Turns on JAX's persistent compilation cache for a command's run; returns its directory (None: off).

    The directory is ``$SERA_JAX_COMPILATION_CACHE`` (``0``/``off``/``false`` turn it off; unset, ``1``/``on``/
    ``true``: ``~/.cache/sera_jax/xla``).
    Compiled executables are then reused by the next run on this machine: the tiny default's 147-task evaluation
    compiles ~22 engine shapes, ~16 s of its ~55 s on 2 cores, and a repeat run skips them. The cache is keyed on the
    program, jax version and device, so a stale entry is never used. An explicit ``jax_compilation_cache_dir``
    (``$JAX_COMPILATION_CACHE_DIR``) is left alone.
    """
    import os

    import jax

    default = str(Path.home() / ".cache" / "sera_jax" / "xla")
    where = os.environ.get("SERA_JAX_COMPILATION_CACHE", default)
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    if where.strip().lower() in ("", "0", "off", "false", "no"):
        return None
    if where.strip().lower() in ("1", "on", "true", "yes"):  # a switch, not a directory named "1"
        where = default
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    return where

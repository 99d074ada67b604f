"""``--simulate GPU`` (and ``engine.backend: simulated``): a command's engines on a simulated device.

The simulated device (``sampling/simulated_engine.py``) keeps the engines' real host path and gives each device
program the roofline time of its shapes on ``GPU`` (``profiling/simulated_time.py``); its tokens are the run's
environment's oracle (``warmstart/simulation_script.py``). This module builds that ``Simulation`` from the config and
installs it in the process before a run is built; every output of the run then says ``"simulated": GPU``. It is
never the default.
"""

from __future__ import annotations

import argparse
from typing import Any

from sera_jax.agents.environments import environment
from sera_jax.config import ConfigError, RunConfig
from sera_jax.profiling.simulated_time import roofline_timer
from sera_jax.profiling.targets import get_target
from sera_jax.sampling.simulation import Simulation, install, label

__all__ = ["add_argument", "install_for", "label", "overrides", "result_fields"]


def add_argument(p: argparse.ArgumentParser) -> None:
    """Adds ``--simulate GPU`` to a command's parser."""
    p.add_argument("--simulate", metavar="GPU", default=None, help=(
        "run the engines on a simulated GPU (h200, h100): the real host path, every device program the roofline "
        "time of its shapes, the environment's oracle's tokens; every output is labelled simulated "
        "(engine.backend=simulated engine.simulate=GPU)"))


def overrides(args: argparse.Namespace) -> list[str]:
    """Returns the config overrides ``--simulate`` stands for (none without it)."""
    gpu = getattr(args, "simulate", None)
    return [] if gpu is None else ["engine.backend=simulated", f"engine.simulate={gpu}"]


def _script(run_cfg: Any, tokenizer: Any):
    return environment(run_cfg.env.name).get("simulation_script")(run_cfg, tokenizer)


def install_for(cfg: RunConfig) -> Simulation | None:
    """Installs the simulated device ``cfg.engine`` names (none for ``engine.backend: device``); returns it. Raises
    ConfigError for an unknown GPU."""
    if cfg.engine.backend != "simulated":
        install(None)
        return None
    try:
        gpu = get_target(cfg.engine.simulate)
    except ValueError as e:
        raise ConfigError(f"engine.simulate: {e}") from None
    sim = Simulation(gpu.name, timer=roofline_timer(gpu.name), script=_script, bytes_limit=gpu.bytes_limit())
    install(sim)
    return sim


def result_fields() -> str:
    """Returns `` simulated=GPU`` for a RESULT line of a simulating process ("" otherwise)."""
    return "".join(f" {k}={v}" for k, v in label().items())

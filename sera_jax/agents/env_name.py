"""The environments' names, one spelling everywhere: configs, the runtime, credit assignment, metrics.

Which names exist is the registry's business (``agents.environments``): ``EnvName`` is a plain string annotation, and
``check_env_name`` asks the registry."""

from __future__ import annotations

from sera_jax.agents.environments import DEFAULT_ENV, check_env_name, names
from sera_jax.agents.environments.textcraft import NAME as TEXTCRAFT
from sera_jax.agents.environments.textworld import NAME as TEXTWORLD

EnvName = str

__all__ = ["DEFAULT_ENV", "TEXTCRAFT", "TEXTWORLD", "EnvName", "check_env_name", "names"]

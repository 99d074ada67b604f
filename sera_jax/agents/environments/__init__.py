"""The environments a run can name (``env.name``): the registry (``registry.py``) and the built-in registrations,
one module per environment (``textcraft.py``, ``textworld.py``). Another environment registers itself with
``register(Environment(...))`` from its own module (see ``tests/agents/test_toy_environment.py``)."""

from sera_jax.agents.environments import textcraft, textworld  # noqa: F401  (the built-ins register on import)
from sera_jax.agents.environments.registry import (
    DEFAULT_ENV,
    BuiltinTokenizer,
    Environment,
    check_env_name,
    environment,
    names,
    register,
    resolve,
    unregister,
)

__all__ = ["DEFAULT_ENV", "BuiltinTokenizer", "Environment", "check_env_name", "environment", "names", "register",
           "resolve", "unregister"]

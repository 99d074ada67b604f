"""The two environments' names, one spelling everywhere: configs, the runtime, credit assignment, metrics."""

from __future__ import annotations

from typing import Literal, get_args

EnvName = Literal["textcraft", "textworld_sync"]
TEXTCRAFT: EnvName = "textcraft"
TEXTWORLD: EnvName = "textworld_sync"
ENV_NAMES: tuple[str, ...] = get_args(EnvName)


def check_env_name(name: str) -> EnvName:
    """Returns ``name`` when it names an environment; raises ValueError naming the choices otherwise."""
    if name not in ENV_NAMES:
        raise ValueError(f"unknown env {name!r}; expected one of {list(ENV_NAMES)}")
    return name  # type: ignore[return-value]

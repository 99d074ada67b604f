"""Loading a RunConfig: YAML files (with ``base:``), ``a.b=c`` overrides, typed construction with coercion, then
validation (``config/validate.py``). Every error is a ``ConfigError`` that names the full key."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from sera_jax.config.schema import ConfigError, RunConfig
from sera_jax.config.validate import validate

# ---------------------------------------------------------------------------------------------------------------
# Typed construction with coercion

_TRUE, _FALSE, _NULL = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}, {"null", "none", "~"}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Returns ``value`` as type ``tp`` (strings from the command line are parsed), or raises ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULL):
            return None
        return _coerce(value, inner[0], key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.strip().strip("[]()").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(v.strip() if isinstance(v, str) else v, args[0], f"{key}[{i}]")
                     for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{key}: expected bool, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-6" (no dot) as a string
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected str, got {value!r}")
    raise TypeError(f"{key}: unsupported field type {tp!r}")


# Keys that were removed, with what replaces them.
RENAMED = {
    "rollout.groups_in_flight": "removed: task groups are admitted one per rank (rollout.tasks_per_step ranks) "
                                "under the reference's quota, see rollout.max_concurrent_rollouts and "
                                "method.max_head_offpolicyness; rollout.speculative_groups_per_rank runs more "
                                "ahead (docs/design/recipes.md §2)",
}


def _build(cls, data: Any, prefix: str):
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of {cls.__name__} fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if key in RENAMED:
            raise ConfigError(f"{key}: {RENAMED[key]}")
        if k not in names:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(names)}")
        kwargs[k] = _coerce(v, hints[k], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a section's own __post_init__ check
        msg = str(e)
        raise ConfigError(msg if prefix and msg.startswith(prefix + ".") else f"{prefix or 'config'}: {msg}") from e


def _merge(base: dict, top: Mapping) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"base: include cycle through {path}")
    if not path.is_file():
        raise ConfigError(f"base: no config file {path}" if seen else f"config: no file {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:  # its own message names "<unicode string>": name the file and line instead
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = " ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ConfigError(f"config: {where}: YAML syntax: {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    bases = [base] if isinstance(base, str) else list(base)
    merged: dict = {}
    for b in bases:
        merged = _merge(merged, _read_yaml(path.parent / b, seen + (path,)))
    return _merge(merged, data)


def parse_override(text: str) -> tuple[list[str], str]:
    """Returns (key path, raw value string) of one ``a.b=c`` override; raises ConfigError when malformed."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise ConfigError(f"{key or text}: an override must look like section.field=value, got {text!r}")
    return key.split("."), value


def _apply_override(data: dict, path: list[str], value: str) -> dict:
    out = dict(data)
    node = out
    for p in path[:-1]:
        child = node.get(p)
        node[p] = dict(child) if isinstance(child, Mapping) else {}
        node = node[p]
    node[path[-1]] = value  # a raw string: coerced to the field's type by _build
    return out


def split_cli(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Returns (YAML paths, ``a.b=c`` overrides) of command-line words: a word holding '=' is an override."""
    paths = [a for a in args if "=" not in a]
    return paths, [a for a in args if "=" in a]


def from_dict(data: Mapping[str, Any], *, num_devices: int | None = None, check_paths: bool = False) -> RunConfig:
    """Returns the validated RunConfig of a nested mapping (unknown keys, types, enums and consistency checked)."""
    cfg = _build(RunConfig, data, "")
    validate(cfg, num_devices=num_devices, check_paths=check_paths)
    return cfg


def load_config(paths: str | Path | Sequence[str | Path] = (), overrides: Sequence[str] = (), *,
                num_devices: int | None = None, check_paths: bool = False) -> RunConfig:
    """Returns the validated RunConfig of YAML file(s) (later files update earlier ones) and ``a.b=c`` overrides.

    ``num_devices``: when given, the mesh must use exactly that many devices (``-1`` axes resolved). ``check_paths``:
    files the config names (``model.hf_dir``) must exist and match the preset's architecture.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    data: dict = {}
    for p in paths:
        data = _merge(data, _read_yaml(Path(p)))
    for text in overrides:
        data = _apply_override(data, *parse_override(text))
    return from_dict(data, num_devices=num_devices, check_paths=check_paths)


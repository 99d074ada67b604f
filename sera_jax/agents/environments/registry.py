"""The environment registry: one ``Environment`` record per environment, looked up by its config name.

Everything that differs between environments outside the environment's own modules is a field here: how a tree's
world and root agent start (``open_world``, ``root_episode``, ``needs_pool``, ``worker_factory``), the runtime's
default caps, what the rubric prompts show, where labels come from (``labels``: programmatic checks or a judge), the credit rules (launch
spans, error filter, zero-variance default, invalid-launch datums), which config settings apply, the warm-start
oracle and its shipped assets, and the builtin tokenizer. Callers ask ``environment(name)`` for the record and read
its fields; none of them tests an environment's name.

Layering: the registry lives in ``agents`` (the lowest room that needs it) and holds plain data and functions only.
Pieces that live in higher rooms (the launch-span parsers in ``rl``, the warm-start oracle in ``warmstart``) and
pieces that would pull JAX into env worker processes (the episodes) are named by a dotted path
``"package.module:attribute"`` and imported on first use by ``resolve``; a field may also hold the object itself
(a test's toy environment registers plain functions). Importing this package therefore imports no JAX and no higher
room, and the import-layer contract holds: a dotted string is not an import until a caller in a room that may
reach it resolves it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Literal

Ref = str | Callable[..., Any] | None  # "module:attribute" (imported on first use) or the object itself

DEFAULT_ENV = "textcraft"  # the config's default (env.name) and the name records without one are read as


@dataclasses.dataclass(frozen=True)
class BuiltinTokenizer:
    """A tokenizer shipped with the package as ``builtin:<name>``: its asset file and the module that rebuilds it."""

    name: str
    asset: str
    rebuild: str


@dataclasses.dataclass(frozen=True)
class Environment:
    """What is specific to one environment, read by the runtime, the launchers, credit assignment, the config
    checks, the warm start and the metrics.

    Episode: ``open_world(task, *, tree_id, pool, settings, rules)`` (async) returns the world handle of one tree
    (``rules``: the world rules of ``env.rules``), ``root_episode(run, world, task, root_id)`` its root agent's
    ``harness.Episode`` (the root node registered in ``run``); ``needs_pool``: a WorkerPool is started when the caller gives none (worlds live in env
    workers); ``worker_factory``: the WorkerPool factory of its worlds (None: the environment runs none there);
    ``runtime_defaults(evaluation)`` → the ``RuntimeSettings`` fields of its reference caps.
    Prompting: ``child_tools_text`` (the rubric prompt's child tools in the execution stage and in selection);
    ``observation_after_launch``: launch results end with the parent's current observation; ``final_state``: what
    a child's scorer sees as the final state ("child_inventory": the child's own inventory record, "world": the
    world's observable state); ``compact_score_request``: the compact scoring prompt's builder.
    Labels: "programmatic" (the world checks every agent; no judge) or "judge" (a judge labels sub-agents).
    Datums: ``launch_spans(code)`` → the (start, end) character spans of the launch statements;
    ``invalid_launch_datums``: a launch attempt that made no child is trained in the delegation stage;
    ``filter_errors``: execution datums of successful trajectories drop turns with errors; ``filter_zero_variance``:
    the default of the execution and delegation stages' zero-variance group filter.
    Config: ``load_tasks(task_set)`` → (tasks, data files); ``task_set_error(task_set, check_paths)`` → an error
    message or None; ``options``: the config settings only this environment reads ("env.rules",
    "warmstart.child_rule", "warmstart.copy_task_set", "order_discrimination": the Rank+Disc ranking objective).
    Warm start: ``warmstart_oracle(cfg, tokenizer, tasks)`` (async) → (datums, stats); ``demo_version`` its
    demonstrations' version; ``warmstart_recipe(cfg)`` → what else shapes its demos (a dict, or None);
    ``shipped_warmstart``: the shipped warm start's asset directory. ``tokenizer``: its builtin tokenizer.
    Simulation: ``simulation_script(cfg, tokenizer)`` → the emissions a simulated device plays (its oracle's).
    """

    name: str
    open_world: Ref
    root_episode: Ref
    needs_pool: bool = False
    worker_factory: str | None = None
    runtime_defaults: Callable[[bool], dict[str, Any]] = lambda evaluation: {}
    child_tools_text: str = ""
    observation_after_launch: bool = False
    final_state: Literal["child_inventory", "world"] = "world"
    compact_score_request: Ref = None
    labels: Literal["programmatic", "judge"] = "judge"
    launch_spans: Ref = None
    invalid_launch_datums: bool = False
    filter_errors: bool = False
    filter_zero_variance: bool = False
    load_tasks: Ref = None
    task_set_error: Ref = None
    options: frozenset[str] = frozenset()
    warmstart_oracle: Ref = None
    simulation_script: Ref = None
    demo_version: Ref = None
    warmstart_recipe: Ref = None
    shipped_warmstart: str | None = None
    tokenizer: BuiltinTokenizer | None = None

    @property
    def programmatic(self) -> bool:
        """Returns whether the world itself labels every agent (no judge is needed)."""
        return self.labels == "programmatic"

    def get(self, field: str) -> Any:
        """Returns the field's object, importing a dotted ``"module:attribute"`` path on first use; raises
        ValueError when the environment has none."""
        value = getattr(self, field)
        if value is None:
            raise ValueError(f"environment {self.name!r} has no {field}")
        return resolve(value)


_REGISTRY: dict[str, Environment] = {}


def resolve(ref: Ref) -> Any:
    """Returns the object a dotted ``"module:attribute"`` path names (attributes may be dotted too), or ``ref``
    itself when it is not a string."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def register(env: Environment, *, replace: bool = False) -> Environment:
    """Registers ``env`` under its name and returns it; raises ValueError when the name is taken (unless
    ``replace``)."""
    if env.name in _REGISTRY and not replace:
        raise ValueError(f"environment {env.name!r} is already registered")
    _REGISTRY[env.name] = env
    return env


def unregister(name: str) -> None:
    """Removes a registration (tests that register a toy environment undo it); a missing name is ignored."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Returns the registered environments' names, in registration order."""
    return tuple(_REGISTRY)


def environment(name: str | None) -> Environment:
    """Returns the registered environment ``name`` (None: the default); raises ValueError naming the registered
    environments otherwise."""
    env = _REGISTRY.get(DEFAULT_ENV if name is None else name)
    if env is None:
        raise ValueError(f"unknown env {name!r}; expected one of {list(_REGISTRY)}")
    return env


def check_env_name(name: str) -> str:
    """Returns ``name`` when it names a registered environment; raises ValueError naming the choices otherwise."""
    return environment(name).name

"""Who plays each of the model's roles (``roles:`` in a config, docs/design/roles.md): the backend of the actor, the
rubric writer, the scorer, the judge and the best-of-N selector, resolved from the config.

A role left null keeps the reference's default: the trainable policy plays the actor, writes and scores rubrics and
selects by its rubric; the judge is what ``judge.kind`` says (the old spelling, still read): ``programmatic`` (the
world's own check: no model), ``openai`` (= ``endpoint``), ``policy_frozen`` (= ``frozen``). Writing both spellings
is allowed when they agree; a contradiction is one ``ConfigError`` line that says what to write.

What each role may be played by (``OFFERED``): the file backend is the rubric writer's alone (a fixed rubric, no
call); the actor is the trainable policy in training (``sera-eval --endpoint`` is how a served actor is evaluated,
the ``endpoint`` section); the selector is the policy's rubric (mode ``rubric``) or an endpoint judge (the
reference's mode ``oracle``: the first candidate judged successful wins, else candidate 0).

Nothing here reads the environment: an endpoint's null address and model are read from ``SERA_EXTERNAL_ENDPOINT`` /
``SERA_EXTERNAL_MODEL`` when the run is assembled (``assembly/roles.py``).
"""

from __future__ import annotations

from typing import Any

from sera_jax.config.schema import BACKENDS, ROLES, ConfigError, RoleSection

ENDPOINT_ENV = "SERA_EXTERNAL_ENDPOINT"   # an endpoint role's base URL when its config leaves it null
MODEL_ENV = "SERA_EXTERNAL_MODEL"         # ... and its model name
OFFERED: dict[str, tuple[str, ...]] = {
    "actor": ("policy", "endpoint"),
    "rubric_writer": ("policy", "frozen", "endpoint", "file"),
    "scorer": ("policy", "frozen", "endpoint"),
    "judge": ("policy", "frozen", "endpoint"),
    "selector": ("policy", "endpoint"),
}
DEFAULTS = {"actor": "policy", "rubric_writer": "policy", "scorer": "policy", "selector": "policy"}
JUDGE_KIND_BACKEND = {"openai": "endpoint", "policy_frozen": "frozen"}   # judge.kind → roles.judge.backend
BACKEND_JUDGE_KIND = {"endpoint": "openai", "frozen": "policy_frozen", "policy": None}
assert set(OFFERED) == set(ROLES) and all(set(v) <= set(BACKENDS) for v in OFFERED.values())


def role_section(cfg: Any, role: str) -> RoleSection:
    """Returns ``cfg.roles.<role>`` (raises KeyError for a name not in ROLES)."""
    if role not in ROLES:
        raise KeyError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    return getattr(cfg.roles, role)


def backend(cfg: Any, role: str) -> str | None:
    """Returns the backend that plays ``role`` under ``cfg``: one of BACKENDS, or None for a judge that is the
    world's programmatic check (``judge.kind: programmatic`` and no ``roles.judge``)."""
    sec = role_section(cfg, role)
    if role == "judge":
        if sec.backend is not None:
            return sec.backend
        return JUDGE_KIND_BACKEND.get(cfg.judge.kind)
    return sec.backend or DEFAULTS[role]


def judge_kind(cfg: Any) -> str:
    """Returns the judge's kind in the old spelling (``programmatic`` | ``openai`` | ``policy_frozen`` |
    ``policy``): what ``assembly/judge.py`` builds."""
    b = backend(cfg, "judge")
    return "programmatic" if b is None else (BACKEND_JUDGE_KIND[b] or "policy")


def endpoint_roles(cfg: Any) -> list[str]:
    """Returns the roles an endpoint plays (the actor's endpoint is the ``endpoint`` section's, not listed)."""
    return [r for r in ROLES if r != "actor" and backend(cfg, r) == "endpoint"]


def frozen_roles(cfg: Any) -> list[str]:
    """Returns the roles a frozen copy of the starting policy plays."""
    return [r for r in ROLES if backend(cfg, r) == "frozen"]


def check_roles(cfg: Any, *, programmatic_env: bool) -> None:
    """Raises ConfigError (one line naming the key and what to write) for a role on a backend it is not offered, for
    old and new judge spellings that contradict each other, and for endpoint or file settings on a role that does
    not use them; returns None."""
    for role in ROLES:
        sec = role_section(cfg, role)
        key = f"roles.{role}"
        b = sec.backend
        if b is not None and b not in OFFERED[role]:
            hint = {"file": "the file backend is the rubric writer's only (a fixed rubric)",
                    "frozen": "a frozen copy of the starting policy does not play this role"}.get(b, "")
            raise ConfigError(f"{key}.backend: {b!r} is not offered for the {role}; write one of "
                              f"{', '.join(OFFERED[role])}" + (f" ({hint})" if hint else ""))
        resolved = backend(cfg, role)
        if role == "actor":
            for f in ("endpoint", "model", "tokenizer", "path"):
                if getattr(sec, f) is not None:
                    raise ConfigError(f"{key}.{f}: a served actor is the endpoint section's (endpoint.urls, "
                                      "endpoint.model, endpoint.tokenizer); remove it")
        elif resolved != "endpoint":
            for f in ("endpoint", "model", "tokenizer"):
                if getattr(sec, f) is not None:
                    raise ConfigError(f"{key}.{f}: set, but the {role} is played by {resolved or 'the world'}, not "
                                      f"an endpoint; write {key}.backend: endpoint or remove {key}.{f}")
        if resolved != "file" and sec.path is not None:
            raise ConfigError(f"{key}.path: set, but only {key}.backend: file reads a rubric file")
        for f in ("concurrency", "timeout_s"):
            if getattr(sec, f) <= 0:
                raise ConfigError(f"{key}.{f}: must be positive, got {getattr(sec, f)}")
        if sec.retries < 0 or sec.backoff_s < 0:
            raise ConfigError(f"{key}.retries: retries and backoff_s must be ≥ 0")
    j, new = cfg.judge, cfg.roles.judge.backend
    if new is not None and j.kind != "programmatic" and JUDGE_KIND_BACKEND[j.kind] != new:
        raise ConfigError(f"roles.judge.backend: {new!r} contradicts judge.kind: {j.kind} (the old spelling of "
                          f"roles.judge.backend: {JUDGE_KIND_BACKEND[j.kind]}); write one of them: remove judge.kind or "
                          f"write judge.kind: {BACKEND_JUDGE_KIND[new] or 'programmatic'} with roles.judge.backend: {new}")
    if new is not None and programmatic_env:
        raise ConfigError(f"roles.judge.backend: {new!r}, but {cfg.env.name}'s labels are the world's programmatic "
                          "check (no judge model); remove roles.judge.backend")
    if new == "endpoint":
        rj = cfg.roles.judge
        for f in ("endpoint", "model"):
            old, mine = getattr(j, f), getattr(rj, f)
            if old is not None and mine is not None and old != mine:
                raise ConfigError(f"roles.judge.{f}: {mine!r} contradicts judge.{f}: {old!r}; write one of them")
    if backend(cfg, "actor") == "endpoint" and not cfg.endpoint.urls:
        raise ConfigError("roles.actor.backend: endpoint needs the endpoint section's urls and model (sera-eval "
                          "--endpoint URL --model NAME)")

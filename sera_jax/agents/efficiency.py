"""Where a rollout's time goes: the engine's busy fraction, the compilations after warm-up, and the agents' time by
what they waited for — measured over one window (a training step's rollouts, an evaluation run).

``RunWatch(engines)`` opens the window (engine counters, JAX's compile counters, a fresh ``Trace`` to activate
around the rollouts); ``finish()`` closes it and returns plain numbers:

* ``seconds`` — the window's wall time;
* ``completion_tokens``, ``completion_tokens_per_s`` — tokens the engines generated (every policy call);
* ``engine_busy_fraction`` — device-busy seconds over the window, averaged over engines (``sampling.device_clock``);
* ``traces``, ``compiles`` (and ``trace_s``) — JAX traces and compilations in the process during the window
  (``sampling.compile_watch``): 0 after a warm-up that covers every shape;
* ``agent_engine_s``, ``agent_env_s``, ``agent_children_s``, ``agent_host_s``, ``agent_lifetime_s`` — agent-seconds
  awaiting generation, the environment and sandbox, their children, and host work (``phases.agent_seconds``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from sera_jax.agents.phases import Trace, agent_seconds
from sera_jax.sampling import compile_watch


def _engines(engine: Any) -> list:
    """The measurable engines behind a generator (an ``Engine``, ``EngineReplicas``; a test double has none)."""
    if engine is None:
        return []
    return [e for e in getattr(engine, "engines", [engine]) if hasattr(e, "clock") and hasattr(e, "stats")]


class RunWatch:
    """Measures one window of rollouts (see the module docstring)."""

    def __init__(self, engine: Any = None, trace: Trace | None = None):
        self.engines = _engines(engine)
        self.trace = trace if trace is not None else Trace()
        self.compiles0 = compile_watch.snapshot()
        self.traced0 = compile_watch.traced_functions()
        self.stats0 = [e.stats() for e in self.engines]
        self.busy0 = [e.clock.busy_s(wait=True) for e in self.engines]
        self.t0 = time.monotonic()

    def finish(self) -> dict[str, float]:
        """Returns the window's numbers (see the module docstring)."""
        t1 = time.monotonic()
        seconds = t1 - self.t0
        out: dict[str, float] = {"seconds": seconds}
        if self.engines:
            busy = [e.clock.busy_s(wait=True) - b for e, b in zip(self.engines, self.busy0)]
            stats1 = [e.stats() for e in self.engines]
            gen = sum(a["generated_tokens"] - b["generated_tokens"] for a, b in zip(stats1, self.stats0))
            out.update(completion_tokens=float(gen), completion_tokens_per_s=gen / seconds if seconds > 0 else 0.0,
                       # A round that began before the window is counted whole when it completes in it: each
                       # engine's fraction is capped at 1.
                       engine_busy_fraction=(sum(min(1.0, b / seconds) for b in busy) / len(busy)
                                             if seconds > 0 else 0.0),
                       engine_compiles=float(sum(a["compiles"] - b["compiles"]
                                                 for a, b in zip(stats1, self.stats0))))
        c = compile_watch.since(self.compiles0)
        out.update(traces=c["traces"], compiles=c["compiles"], trace_s=c["traces_s"] + c["lowerings_s"])
        traced = {k: n - self.traced0.get(k, 0) for k, n in compile_watch.traced_functions().items()}
        self.traced = {k: n for k, n in traced.items() if n}  # which functions were traced (not a number: kept aside)
        out.update({f"agent_{k}_s": v for k, v in agent_seconds(self.trace, self.t0, t1).items()})
        return out


def efficiency_line(eff: dict[str, float]) -> str:
    """Returns a one-line summary of ``RunWatch.finish()``'s numbers."""
    parts = [f"{eff['seconds']:.1f} s"]
    if "completion_tokens_per_s" in eff:
        parts.append(f"{eff['completion_tokens_per_s']:.0f} completion tokens/s, engine busy "
                     f"{eff['engine_busy_fraction']:.0%}")
    parts.append(f"{int(eff['traces'])} traces / {int(eff['compiles'])} compiles after warm-up")
    life = eff.get("agent_lifetime_s", 0.0)
    if life > 0:
        parts.append("agent time: " + ", ".join(f"{k} {eff[f'agent_{k}_s'] / life:.0%}"
                                                for k in ("engine", "env", "children", "host")))
    return "; ".join(parts)


def mean_efficiency(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Returns the field-wise mean of several windows' numbers."""
    if not runs:
        return {}
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: sum(r.get(k, 0.0) for r in runs) / len(runs) for k in keys}

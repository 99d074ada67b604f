"""Timestamped runtime events and the per-phase wall time they add up to (issue #9: "wall time by phase").

A ``Trace`` collects events (``time.monotonic`` seconds); a *span* is a ``<kind>_start`` / ``<kind>_end`` pair.
Span kinds and the phase each one counts towards:

==========  ==========  ===========================================================================================
kind        phase       what it covers (who records it)
==========  ==========  ===========================================================================================
generate    generation  one agent turn awaiting ``generator.generate`` (``harness.TreeRun.policy_turn``)
rubric      generation  a rubric-writing policy call (``policy_call``, names ``rubric:…``)
call        generation  any other side call of the policy (``policy_call``)
env         env         one environment action: a TextCraft cell, a TextWorld command (the episodes) — minus the
                        time the same agent spends in ``launch`` spans, because a cell that calls
                        ``launch_subagent`` waits for the whole child tree, which is not env work of its own
score       scoring     a rubric-scoring policy call (``policy_call``, names ``score:…``)
judge       scoring     one request to the branch judge: an HTTP request (``ChatJudge``) or a frozen-policy call
                        (``PolicyJudge`` through ``policy_call``, names ``judge:…``); back-off sleeps excluded
launch      —           a delegation handled by the tree's launcher (``harness.TreeRun``); only subtracted from env
==========  ==========  ===========================================================================================

Many agents run at once, so spans overlap, within a phase and across phases. ``phase_times`` therefore reports two
numbers per phase over a window (a training step's rollout): ``<phase>_s``, the wall time during which at least one
span of the phase was open (the length of the union of its intervals, ≤ the window), and ``<phase>_busy_s``, the sum
of the span durations (agent-seconds; exceeds the window when agents overlap). Phases overlap each other too (one
tree generates while another waits on its world), so the ``<phase>_s`` do not add up to the window;
``uncovered_s`` is the window's time during which no generation, env or scoring span was open (host work: prompt
encoding, parsing, forks, credit assignment, scheduling).

Which trace is recorded into: a ``TreeRun`` given one explicitly, else the *active* trace (``CURRENT_TRACE``, set by
``tracing(trace)``; asyncio tasks inherit it when they are created). The training loop activates a fresh trace
around each step's rollouts, so side calls and judge calls made anywhere below it are recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import time
from typing import Any, Iterator, Sequence

PHASE_OF = {"generate": "generation", "rubric": "generation", "call": "generation", "env": "env",
            "score": "scoring", "judge": "scoring"}
PHASES = ("generation", "env", "scoring")
SIDE_CALL_KINDS = ("rubric", "score", "judge")  # policy_call names "<kind>:<subject>" with these prefixes


class Trace:
    """Timestamped runtime events, kept out of the records so that records stay replayable; used to show overlap
    (generation of one tree while another waits on its env) and to time the phases of a step."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count()

    def add(self, kind: str, **fields: Any) -> None:
        self.events.append({"t": time.monotonic(), "kind": kind, **fields})

    @contextlib.contextmanager
    def span(self, kind: str, **fields: Any) -> Iterator[None]:
        """Records ``<kind>_start`` now and ``<kind>_end`` when the block exits (also on error or cancellation),
        both tagged with a fresh span id so that concurrent spans of one agent pair correctly."""
        sid = next(self._ids)
        self.add(f"{kind}_start", span=sid, **fields)
        try:
            yield
        finally:
            self.add(f"{kind}_end", span=sid, **fields)

    def spans(self, start: str, end: str, **match: Any) -> list[tuple[float, float, dict]]:
        """Returns (t_start, t_end, start event) of each start/end pair, paired by span id when the events carry
        one, else by equal tree/node/turn fields; only events whose fields equal ``match``."""
        open_: dict[tuple, dict] = {}
        out = []
        for e in self.events:
            if any(e.get(k) != v for k, v in match.items()):
                continue
            ident = ("span", e["span"]) if "span" in e else (e.get("tree"), e.get("node"), e.get("turn"))
            if e["kind"] == start:
                open_[ident] = e
            elif e["kind"] == end and ident in open_:
                s = open_.pop(ident)
                out.append((s["t"], e["t"], s))
        return out

    def intervals(self, kind: str, *, until: float | None = None) -> list[tuple[float, float, dict]]:
        """Returns the spans of ``kind`` as (t0, t1, start event); a span still open ends at ``until`` (default:
        now)."""
        done = self.spans(f"{kind}_start", f"{kind}_end")
        closed = {id(s) for _, _, s in done}
        end = time.monotonic() if until is None else until
        still_open = [(e["t"], end, e) for e in self.events if e["kind"] == f"{kind}_start" and id(e) not in closed]
        return done + still_open


CURRENT_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("sera_current_trace", default=None)


def current_trace() -> Trace | None:
    """Returns the active trace (None when nothing is being traced)."""
    return CURRENT_TRACE.get()


@contextlib.contextmanager
def tracing(trace: Trace | None) -> Iterator[Trace | None]:
    """Makes ``trace`` the active trace inside the block (and in asyncio tasks created inside it); yields it."""
    token = CURRENT_TRACE.set(trace)
    try:
        yield trace
    finally:
        CURRENT_TRACE.reset(token)


def span(kind: str, trace: Trace | None = None, **fields: Any):
    """Returns a context manager recording a ``kind`` span in ``trace`` (default: the active trace); a no-op when
    there is none."""
    trace = trace if trace is not None else CURRENT_TRACE.get()
    return trace.span(kind, **fields) if trace is not None else contextlib.nullcontext()


# -- interval arithmetic ---------------------------------------------------------------------------------------
def union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Returns the sorted, disjoint union of ``intervals`` (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(interval: tuple[float, float], holes: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Returns the parts of ``interval`` outside the (disjoint, sorted) ``holes``."""
    a, b = interval
    out = []
    for h0, h1 in holes:
        if h1 <= a or h0 >= b:
            continue
        if h0 > a:
            out.append((a, h0))
        a = max(a, h1)
    if b > a:
        out.append((a, b))
    return out


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return float(sum(b - a for a, b in intervals))


def phase_intervals(trace: Trace, start: float, end: float) -> dict[str, list[tuple[float, float]]]:
    """Returns each phase's span intervals clipped to [start, end] (env spans minus the same agent's launches)."""
    def clip(iv):
        return [(max(a, start), min(b, end)) for a, b in iv if min(b, end) > max(a, start)]

    def agent(e):
        return e.get("tree"), e.get("node")

    launches: dict[tuple, list[tuple[float, float]]] = {}
    for a, b, e in trace.intervals("launch", until=end):
        launches.setdefault(agent(e), []).append((a, b))
    launches = {k: union(v) for k, v in launches.items()}
    out: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
    for kind, phase in PHASE_OF.items():
        for a, b, e in trace.intervals(kind, until=end):
            pieces = subtract((a, b), launches.get(agent(e), [])) if kind == "env" else [(a, b)]
            out[phase].extend(clip(pieces))
    return out


def phase_times(trace: Trace, start: float, end: float) -> dict[str, float]:
    """Returns, over the window [start, end] (``time.monotonic`` seconds): ``<phase>_s`` (union-of-intervals wall
    time) and ``<phase>_busy_s`` (summed span durations) for generation, env and scoring, and ``uncovered_s`` (window
    time with no span of any phase open); see the module docstring."""
    iv = phase_intervals(trace, start, end)
    out: dict[str, float] = {}
    for p in PHASES:
        out[f"{p}_s"] = _length(union(iv[p]))
        out[f"{p}_busy_s"] = _length(iv[p])
    covered = _length(union([x for p in PHASES for x in iv[p]]))
    out["uncovered_s"] = max(0.0, (end - start) - covered)
    return out


AGENT_WAITS = ("engine", "env", "children", "host")


def agent_seconds(trace: Trace, start: float, end: float) -> dict[str, float]:
    """Returns where the agents' time went over [start, end], in agent-seconds summed over agents:
    ``engine`` (awaiting their own turns' generation), ``env`` (their environment actions and sandbox cells, minus
    delegations), ``children`` (their delegations: the children's whole trees and the rubric and scoring calls
    around them) and ``host`` (the rest of each agent's lifetime: prompt building, tokenisation, parsing, and waiting
    for the event loop), plus ``lifetime``. An agent's own spans never overlap, so they add up to its lifetime."""
    def clip(iv):
        return [(max(a, start), min(b, end)) for a, b in iv if min(b, end) > max(a, start)]

    def agent(e):
        return e.get("tree"), e.get("node")

    per: dict[tuple, dict[str, list[tuple[float, float]]]] = {}
    for kind, key in (("agent", "lifetime"), ("generate", "engine"), ("env", "env"), ("launch", "children")):
        for a, b, e in trace.intervals(kind, until=end):
            per.setdefault(agent(e), {}).setdefault(key, []).append((a, b))
    out = dict.fromkeys(AGENT_WAITS + ("lifetime",), 0.0)
    for spans in per.values():
        launches = union(spans.get("children", []))
        env = [p for iv in spans.get("env", []) for p in subtract(iv, launches)]
        parts = {"engine": _length(clip(union(spans.get("engine", [])))), "env": _length(clip(union(env))),
                 "children": _length(clip(launches))}
        life = _length(clip(union(spans.get("lifetime", []))))
        for k, v in parts.items():
            out[k] += v
        out["host"] += max(0.0, life - sum(parts.values()))
        out["lifetime"] += life
    return out

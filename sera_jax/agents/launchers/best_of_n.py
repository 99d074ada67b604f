"""Test-time selection among N candidate subtrees per delegation (docs/design/algorithm.md §10), for both environments (the reference
allows it only for TextWorld; nothing in the method is TextWorld-specific, so TextCraft gets it too).

At each delegation, for each requested child in order (several goals of one delegate block are resolved one after
another, each starting from the previous commit):

* N forks are reserved from the task's fork budget (32, strict): if used + N > 32 nothing is forked and the parent
  is told ``Fork budget exhausted; complete this delegation locally.``;
* one rubric is written from the parent's context (temperature 0, 1,024 tokens, min 2 items);
* the world is forked N times and candidate i runs the child ``<child id>#c<i>`` with its whole subtree to
  completion on clone i, at temperature 1.0 whatever the tree's temperature (the root's evaluation turns stay at 0);
* each finished candidate is scored under the frozen rubric (temperature 0, 512 tokens);
* the highest valid score wins, ties go to the lowest index; an invalid rubric or no valid score selects
  candidate 0; the chosen clone's whole state is committed.

With an external selector (``roles.selector.backend: endpoint``, the reference's mode ``oracle``) no rubric is
written: each finished candidate is labelled by the selector's binary judge in index order, the first one judged
successful wins, and candidate 0 wins when none is (a failed label counts as not successful). Its requests are
counted as ``selector/endpoint`` spend (``agents/roles.py``).

The parent then gets the environment's usual answer about the chosen child. The DelegationPoint's ``misc`` keeps
the candidates, their scores, the chosen index and any rubric/score errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from envs_py.textcraft.cells import subagent_result_text
from envs_py.textworld_sync import messages as M
from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.launchers.base import LaunchOutcome, LaunchRequest, child_result
from sera_jax.agents.records import Node
from sera_jax.agents.roles import POLICY_ROLES, RoleCallers, add_spend
from sera_jax.agents.rubric_calls import (
    RubricConfig,
    observable_state,
    rubric_context,
    score_node,
    write_rubric,
)
from sera_jax.agents.textworld import child_summary

EXHAUSTED_TEXT = "Fork budget exhausted; complete this delegation locally."
CANDIDATE_MARK = "#c"


def choose_first_success(labels: list[bool | None]) -> int:
    """Returns the index of the first candidate labelled successful, else 0 (the reference's ``oracle`` mode)."""
    return next((i for i, ok in enumerate(labels) if ok is True), 0)


def choose(scores: list[float | None]) -> int:
    """Returns the index of the highest valid score (ties → lowest index; none valid → 0)."""
    best, best_i = None, 0
    for i, s in enumerate(scores):
        if s is not None and (best is None or s > best):
            best, best_i = s, i
    return best_i


class CandidateTemperature:
    """A generator wrapper: turns of agents inside a candidate subtree (ids containing ``#c``; side calls, named
    ``kind:subject``, excluded) sample at ``temperature``; every other call passes through unchanged."""

    def __init__(self, inner: Any, temperature: float = 1.0):
        self.inner, self.temperature = inner, temperature

    async def generate(self, prompt_ids, params, key=None):
        info = CURRENT_TURN.get()
        if info is not None and CANDIDATE_MARK in info.node_id and ":" not in info.node_id:
            params = dataclasses.replace(params, temperature=self.temperature)
        return await self.inner.generate(prompt_ids, params, key)


class BestOfNSelector:
    """Test-time selection launcher (see the module docstring)."""

    kind = "best_of_n"

    def __init__(self, env: EnvName, *, n: int = 2, fork_budget: int = 32, candidate_temperature: float = 1.0,
                 config: RubricConfig | None = None, rubric_temperature: float = 0.0,
                 max_rubric_tokens: int = 1024, max_scoring_tokens: int = 512, roles: RoleCallers | None = None):
        if n < 1:
            raise ValueError("n must be ≥ 1")
        self.env, self.n, self.fork_budget = env, n, fork_budget
        self.candidate_temperature = candidate_temperature
        self.config = config or RubricConfig()
        self.rubric_spec = self.config.rubric_spec(rubric_temperature, max_rubric_tokens)
        self.scoring_spec = self.config.scoring_spec(max_scoring_tokens)
        self.used = 0
        self.roles = roles or POLICY_ROLES  # rubric writer and scorer, or the oracle judge (agents/roles.py)

    async def launch(self, req: LaunchRequest) -> LaunchOutcome:
        """Returns the chosen candidate per requested child (answered as by the default launcher), or the
        budget message for children that got no candidates."""
        run = req.run
        if not isinstance(run.generator, CandidateTemperature):
            run.generator = CandidateTemperature(run.generator, self.candidate_temperature)
        chosen: list[Node | None] = []
        records = []
        for spec in req.specs:
            if self.used + self.n > self.fork_budget:
                chosen.append(None)
                records.append({"child_id": spec.child_id, "exhausted": True})
                continue
            self.used += self.n
            node, record = await self._select(req, spec)
            chosen.append(node)
            records.append(record)
        misc = {"selection": records, "forks_used": self.used}
        if all(c is not None for c in chosen):
            return LaunchOutcome(children=chosen, kind=self.kind, misc=misc)
        return LaunchOutcome(children=[c for c in chosen if c is not None], kind=self.kind,
                             texts=await self._texts(req, chosen), misc=misc)

    async def _select(self, req: LaunchRequest, spec) -> tuple[Node, dict]:
        if self.roles.selector_judge is not None:
            return await self._select_oracle(req, spec)
        run, parent, cfg = req.run, req.parent, self.config
        state = await observable_state(req.env)
        ctx = rubric_context(parent, req.parent_messages, req.parent_action, state, spec.goal, env=self.env,
                             stage="evaluation", child_budget=spec.budget_shown(),
                             metadata={"parent_trajectory_id": parent.id, "parent_depth": parent.depth,
                                       "child_depth": spec.depth, "fork_step": req.fork_step})
        _, rubric, rerr = await write_rubric(run, ctx, self.rubric_spec, f"rubric:{spec.child_id}",
                                             min_items=cfg.min_items, depth=parent.depth,
                                             caller=self.roles.rubric_writer)
        worlds = [await req.env.fork() for _ in range(self.n)]
        nodes = await asyncio.gather(*(
            req.start_child(dataclasses.replace(spec, child_id=f"{spec.child_id}{CANDIDATE_MARK}{i}"), env=w)
            for i, w in enumerate(worlds)))
        scores: list[float | None] = [None] * self.n
        errors: dict[str, str] = {}
        if rubric is not None:
            async def one(i: int):
                final = await observable_state(worlds[i])
                return await score_node(run, rubric, nodes[i], final, self.scoring_spec, f"score:{nodes[i].id}",
                                        caller=self.roles.scorer)

            for i, (_, score, serr) in enumerate(await asyncio.gather(*(one(i) for i in range(self.n)))):
                scores[i] = score.value if score is not None else None
                if serr:
                    errors[str(i)] = serr
        k = choose(scores)
        await self._commit(req, worlds, k)
        for i, node in enumerate(nodes):
            node.branch_index = i
            node.misc["selection"] = {"score": scores[i], "selected": i == k}
        return nodes[k], {"child_id": spec.child_id, "candidates": [n.id for n in nodes], "scores": scores,
                          "selected": k, "rubric": rubric, "rubric_error": rerr, "score_errors": errors}

    async def _commit(self, req: LaunchRequest, worlds: list, k: int) -> None:
        await req.env.commit(worlds[k])
        for w in worlds:
            try:
                await w.close()
            except Exception:  # noqa: BLE001  (freeing a discarded clone may fail; the commit already happened)
                pass

    async def _select_oracle(self, req: LaunchRequest, spec) -> tuple[Node, dict]:
        """The ``oracle`` selector: candidates run as in rubric mode, then the judge labels them in order."""
        worlds = [await req.env.fork() for _ in range(self.n)]
        nodes = await asyncio.gather(*(
            req.start_child(dataclasses.replace(spec, child_id=f"{spec.child_id}{CANDIDATE_MARK}{i}"), env=w)
            for i, w in enumerate(worlds)))
        judge, tree = self.roles.selector_judge, req.run.tree
        labels: list[bool | None] = []
        errors: dict[str, str] = {}
        for i, node in enumerate(nodes):
            try:
                label = await judge.label(node, req.parent.goal)
            except Exception as e:  # noqa: BLE001  (a judge bug counts as no label: the candidate is not chosen)
                labels.append(None)
                errors[str(i)] = f"{type(e).__name__}: {e}"
                add_spend(tree, "selector/endpoint", calls=1, failures=1)
                continue
            labels.append(label.success)
            if label.error:
                errors[str(i)] = label.error
            add_spend(tree, "selector/endpoint", calls=label.attempts, prompt_tokens=label.prompt_tokens,
                      completion_tokens=label.completion_tokens,
                      failures=label.attempts - int(label.success is not None))
            if label.success is True:
                break  # the first success wins: later candidates need no label
        k = choose_first_success(labels)
        await self._commit(req, worlds, k)
        for i, node in enumerate(nodes):
            node.branch_index = i
            node.misc["selection"] = {"label": labels[i] if i < len(labels) else None, "selected": i == k}
        return nodes[k], {"child_id": spec.child_id, "candidates": [n.id for n in nodes], "labels": labels,
                          "selected": k, "mode": "oracle", "label_errors": errors}

    async def _texts(self, req: LaunchRequest, chosen: list[Node | None]) -> list[str]:
        if not environment(self.env).observation_after_launch:  # TextCraft's per-child result texts
            remaining = req.parent.max_steps - len(req.parent.turns)
            return [EXHAUSTED_TEXT if c is None else
                    subagent_result_text(child_result(c), len(c.turns), c.max_steps, remaining) for c in chosen]
        obs, _ = await req.env.observe(req.parent.id)
        done = [child_summary(c) for c in chosen if c is not None]
        lines = [EXHAUSTED_TEXT] * sum(c is None for c in chosen)
        if done:
            lines.append(M.subagent_results_text(done, obs))
        else:
            lines.append(f"\n[Current Environment Observation]\n{obs}")
        return lines

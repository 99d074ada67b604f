"""TextWorld-Sync: the shared-state multi-agent cooking world of SERA (docs/design/textworld.md).

Public names:
* `load_tasks(path | "sample")` -> list[TaskSpec]  (manifest .json, manifest-rows .jsonl or raw .jsonl)
* `generate_tasks(fold="test", base_seed=None, ...)` -> list[TaskSpec]; `generate_task(family, difficulty, seed)`
* `make_world(task, rules="reference" | "full")` -> World  (the Env protocol; factory for the workers registry)
* `Coordinator(task, rules)` -> one lock per task; async `step` / `observe`, `fork_shared`, `fork`, `commit`
* `parse_reply(text)` -> Reply  (action / inventory / delegate / finish / invalid with an error text)
* `score_task(task_dishes, object_tree)` -> report; `oracle_actions(task)`, `oracle_split_actions(task, n)`
"""

from envs_py.textworld_sync.tasks import TaskSpec
from envs_py.textworld_sync.loader import load_tasks, sample_path, write_manifest, write_rows
from envs_py.textworld_sync.generator import generate_task, generate_tasks
from envs_py.textworld_sync.world import World, make_world
from envs_py.textworld_sync.coordinator import AgentView, Coordinator
from envs_py.textworld_sync.protocol import Delegation, Reply, parse_reply
from envs_py.textworld_sync.scorer import score_task
from envs_py.textworld_sync.solver import oracle_actions, oracle_split_actions, run_oracle

ENV_NAME = "textworld_sync"

__all__ = [
    "ENV_NAME", "TaskSpec", "load_tasks", "sample_path", "write_manifest", "write_rows", "generate_task",
    "generate_tasks", "World", "make_world", "Coordinator", "AgentView", "Delegation", "Reply", "parse_reply",
    "score_task", "oracle_actions", "oracle_split_actions", "run_oracle",
]

"""TextWorld-Sync: the shared-state multi-agent cooking world of SERA (spec: textworld_sync.md).

Public names: `load_tasks`, `generate_tasks`, `make_world`, `World`, `Coordinator`, `AgentView`, `TaskSpec`,
`parse_reply`, `score_task`, `oracle_actions`, `oracle_split_actions`.
"""

from envs_py.textworld_sync.tasks import TaskSpec
from envs_py.textworld_sync.loader import load_tasks, write_manifest, write_rows
from envs_py.textworld_sync.world import World, make_world
from envs_py.textworld_sync.scorer import score_task

__all__ = ["TaskSpec", "load_tasks", "write_manifest", "write_rows", "World", "make_world", "score_task"]

"""Env workers: trees hosted by id, callbacks for launch_subagent, fork/commit, and crash handling."""

import asyncio
import os
import signal
import time

import pytest

from envs_py.workers import ENV_FACTORIES, TreeFailed, WorkerDied, WorkerPool, register_env
from envs_py.textcraft import load_tasks


@pytest.fixture(scope="module")
def task():
    return load_tasks("val")[0]  # 3x o5_i2_15 from raw_o7 3, raw_o5 9, raw_t6 1


def test_tree_lifecycle_launch_fork_commit(task):
    async def main():
        async with WorkerPool(2) as pool:
            await pool.create("t", "textcraft", task, max_steps=12)
            assert "budget of 12 steps" in await pool.call("t", "observe", "root")

            async def launch(parent, req):
                child = f"{parent}/0"
                await pool.call("t", "add_agent", child, req["targets"], parent)
                r = await pool.run_cell("t", child, "print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made it');")
                return f"{r['output'].strip()} | depth {req['depth']}"

            r = await pool.run_cell("t", "root", "print(await launch_subagent({'o3_i1': 4}))", launch)
            assert r["ok"] and r["output"] == "Successfully crafted 4 o3_i1(s) | depth 1\n", r
            assert (await pool.call("t", "check", "root/0")).success
            await pool.fork("t", "b")
            r = await pool.run_cell("b", "root", "craft({'raw_o7': 1, 'o3_i1': 1}, ('o5_i2_15', 3))\nfinish('ok')")
            assert r["finished"] and (await pool.call("b", "check", "root")).success
            assert not (await pool.call("t", "check", "root")).success  # the fork was isolated
            assert await pool.call("t", "digest") != await pool.call("b", "digest")
            await pool.commit("t", "b")
            assert await pool.call("t", "digest") == await pool.call("b", "digest")
            assert (await pool.call("t", "view_inventory"))["o5_i2_15"] == 3
            with pytest.raises(AttributeError):
                await pool.call("t", "_private")
            with pytest.raises(KeyError):
                await pool.call("nope", "digest")
            with pytest.raises(ValueError, match="already exists"):
                await pool.fork("t", "b")
            await pool.drop("b")

    asyncio.run(main())


def test_killed_worker_fails_its_trees_and_the_next_request_works(task):
    async def main():
        async with WorkerPool(1) as pool:
            await pool.create("victim", "textcraft", task)
            pid = pool.worker_pid("victim")
            cell = asyncio.ensure_future(pool.run_cell("victim", "root", "while True:\n    pass"))
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(WorkerDied, match="died.*victim"):
                await cell
            assert time.monotonic() - t0 < 5
            with pytest.raises(TreeFailed, match="victim"):
                await pool.call("victim", "digest")
            await pool.create("next", "textcraft", task)
            assert pool.worker_pid("next") != pid
            r = await pool.run_cell("next", "root", "view_inventory()")
            assert r["ok"] and r["output"] == "{'raw_o7': 3, 'raw_o5': 9, 'raw_t6': 1}\n"
            await pool.drop("victim")  # forgetting a failed tree is fine

    asyncio.run(main())


def test_registry_is_environment_agnostic(task):
    register_env("tc-world", "envs_py.textcraft.world:TextCraftWorld.from_task")
    try:
        async def main():
            async with WorkerPool(1) as pool:
                await pool.create("w", "tc-world", task)
                v = await pool.call("w", "call_tool", "root", "craft", ({"raw_o5": 2}, ("o3_i1", 4)), {})
                assert v == "Successfully crafted 4 o3_i1(s)"
                with pytest.raises(KeyError):
                    await pool.create("z", "no-such-env", task)

        asyncio.run(main())
    finally:
        ENV_FACTORIES.pop("tc-world")


def test_prewarmed_sandboxes_serve_new_agents(task):
    async def main():
        async with WorkerPool(1) as pool:
            await pool.create("p", "textcraft", task, sandbox_spares=2)
            await pool.run_cell("p", "root", "x = 1")  # first cell starts the pool
            await asyncio.sleep(1.0)  # spares come up in the background
            for i in range(3):
                await pool.call("p", "add_agent", f"c{i}", {"o3_i1": 4}, "root")
            outs = await asyncio.gather(*(pool.run_cell("p", f"c{i}", f"print({i})") for i in range(2)))
            assert [o["output"] for o in outs] == ["0\n", "1\n"]
            r = await pool.run_cell("p", "c2", "print(x if 'x' in dir() else 'fresh')")
            assert r["output"] == "fresh\n"  # every agent has its own namespace

    asyncio.run(main())

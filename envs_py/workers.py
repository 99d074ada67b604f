"""Env worker processes: each hosts many trees' worlds by id; the runtime drives them through an async client.

Environment-agnostic: a worker builds a tree with a factory looked up by env name in a registry of
``"module:callable"`` paths (``register_env``); TextCraft is registered by default, TextWorld-Sync can be added
the same way. A hosted tree object may offer any public methods (called by name), ``fork()``/``commit(branch)``,
``async run_cell(agent_id, code, launch)`` (``launch`` is a callback into the runtime, used for
``launch_subagent``) and ``async close()``.

If a worker dies (or is killed), every request in flight on it fails with :class:`WorkerDied`, its trees are
marked failed (later requests on them raise :class:`TreeFailed`, so the runtime scores them as failures instead
of hanging), and a fresh worker replaces it for new trees.

Every value and callback payload the client receives has its strings made valid UTF-8 (``envs_py.text.valid_tree``):
cell output, errors, finish messages and observations are text a cell or a reply wrote, and reach the runtime as data.

Client and worker talk over a socketpair with 4-byte-length-prefixed pickle frames: both ends are our own
trusted code (model-written code never runs in a worker; it runs in the sandboxes the worker starts).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
from typing import Any, Awaitable, Callable

from envs_py.text import valid_tree

_HDR = struct.Struct("<I")
ENV_FACTORIES: dict[str, str] = {"textcraft": "envs_py.textcraft.session:TextCraftSession.from_task"}


def register_env(name: str, factory_path: str) -> None:
    """Registers ``"module:attr.attr"`` as the tree factory of env ``name`` (called as factory(task, **kwargs)).
    Workers started afterwards know it."""
    ENV_FACTORIES[name] = factory_path


class WorkerDied(RuntimeError):
    """The env worker hosting a tree died while a request was in flight; the tree is failed."""


class TreeFailed(RuntimeError):
    """A request named a tree whose worker died earlier; the tree counts as a failure."""


def _resolve(path: str) -> Callable:
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (n,) = _HDR.unpack(await reader.readexactly(4))
    return pickle.loads(await reader.readexactly(n))


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HDR.pack(len(body)) + body


# -- worker side ----------------------------------------------------------------------------------------------
class _WorkerServer:
    def __init__(self, factories: dict[str, str], writer: asyncio.StreamWriter):
        self.factories, self.writer = factories, writer
        self.trees: dict[str, Any] = {}
        self.callbacks: dict[int, asyncio.Future] = {}
        self.cb_ids = itertools.count()

    def send(self, obj: Any) -> None:
        self.writer.write(_frame(obj))

    async def callback(self, rid: int, name: str, payload: Any) -> Any:
        cid = next(self.cb_ids)
        fut = asyncio.get_running_loop().create_future()
        self.callbacks[cid] = fut
        self.send({"cb": cid, "rid": rid, "name": name, "payload": payload})
        return await fut

    async def handle(self, req: dict) -> None:
        rid = req["id"]
        try:
            value = await self.dispatch(rid, req)
            self.send({"id": rid, "ok": True, "value": value})
        except Exception as e:  # noqa: BLE001  (reported to the client, the worker lives on)
            try:
                self.send({"id": rid, "ok": False, "error": e})
            except Exception:  # noqa: BLE001  (unpicklable exception)
                self.send({"id": rid, "ok": False, "error": RuntimeError(f"{type(e).__name__}: {e}")})

    async def dispatch(self, rid: int, req: dict) -> Any:
        op, tree_id = req["op"], req.get("tree")
        if op == "ping":
            return os.getpid()
        if op == "create":
            if tree_id in self.trees:
                raise ValueError(f"tree {tree_id!r} already exists; drop it first")
            factory = _resolve(self.factories[req["env"]])
            self.trees[tree_id] = factory(req["task"], **req.get("kwargs", {}))
            return None
        tree = self.trees.get(tree_id)
        if tree is None:
            raise KeyError(f"unknown tree {tree_id!r}")
        if op == "drop":
            self.trees.pop(tree_id)
            if hasattr(tree, "close"):
                await tree.close()
            return None
        if op == "fork":
            if req["new"] in self.trees:
                raise ValueError(f"tree {req['new']!r} already exists; drop it first")
            self.trees[req["new"]] = tree.fork()
            return None
        if op == "commit":
            tree.commit(self.trees[req["branch"]])
            return None
        if op == "run_cell":
            async def launch(agent_id: str, request: dict) -> str:
                return await self.callback(rid, "launch_subagent", {"agent_id": agent_id, **request})
            return await tree.run_cell(req["agent"], req["code"], launch)
        if op == "call":
            name = req["method"]
            if not isinstance(name, str) or name.startswith("_"):
                raise AttributeError(f"no public method {name!r}")
            value = getattr(tree, name)(*req.get("args", ()), **req.get("kwargs", {}))
            return await value if asyncio.iscoroutine(value) else value
        raise ValueError(f"unknown op {op!r}")


async def _serve(fd: int, factories: dict[str, str]) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    server = _WorkerServer(factories, writer)
    tasks = set()
    while True:
        try:
            msg = await _read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        if "cb" in msg:  # the runtime answered a callback
            fut = server.callbacks.pop(msg["cb"], None)
            if fut is not None and not fut.done():
                fut.set_result(msg.get("value")) if msg.get("ok") else fut.set_exception(msg["error"])
            continue
        task = asyncio.ensure_future(server.handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


# -- client side ----------------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, index: int, proc: subprocess.Popen, reader, writer):
        self.index, self.proc, self.reader, self.writer = index, proc, reader, writer
        self.pending: dict[int, asyncio.Future] = {}
        self.handlers: dict[int, Callable] = {}  # request id -> its launch callback
        self.trees: set[str] = set()
        self.alive = True
        self.reader_task: asyncio.Task | None = None


def _valid_error(exc: BaseException) -> BaseException:
    """Returns a worker's exception with the strings of its ``args`` made valid UTF-8 (its message may quote what a
    cell wrote); the same exception object, its type kept."""
    try:
        exc.args = valid_tree(exc.args)
    except Exception:  # noqa: BLE001  (an exception type that refuses new args keeps its own)
        pass
    return exc


class WorkerPool:
    """Async client of ``n`` env worker processes. Trees are pinned to a worker when created.

    ``launch`` callbacks passed to :meth:`run_cell` are awaited as ``launch(agent_id, request)`` where ``request``
    holds ``goal``, ``targets`` and ``depth`` of the validated sub-agent; their string is returned to the cell.
    """

    def __init__(self, n: int = 1, factories: dict[str, str] | None = None):
        self.n = n
        self.factories = dict(factories or ENV_FACTORIES)
        self.workers: list[_Worker | None] = [None] * n
        self.tree_worker: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.ids = itertools.count()
        self._rr = itertools.count()
        self._spawning: dict[int, asyncio.Task] = {}

    async def start(self) -> "WorkerPool":
        """Starts every worker; returns self."""
        await asyncio.gather(*(self._spawn(i) for i in range(self.n)))
        return self

    async def _spawn(self, i: int) -> _Worker:
        parent, child = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-m", "envs_py.workers", str(child.fileno()),
                                 json.dumps(self.factories)], pass_fds=(child.fileno(),), env=env)
        child.close()
        reader, writer = await asyncio.open_connection(sock=parent)
        w = _Worker(i, proc, reader, writer)
        self.workers[i] = w
        w.reader_task = asyncio.ensure_future(self._read_loop(w))
        await self._request(w, {"op": "ping"})
        return w

    async def _live_worker(self, i: int) -> _Worker:
        w = self.workers[i]
        if w is not None and w.alive:
            return w
        task = self._spawning.get(i)
        if task is None or task.done():
            task = self._spawning[i] = asyncio.ensure_future(self._spawn(i))
        return await asyncio.shield(task)

    async def _read_loop(self, w: _Worker) -> None:
        try:
            while True:
                msg = await _read_frame(w.reader)
                if "cb" in msg:
                    asyncio.ensure_future(self._answer_callback(w, msg))
                    continue
                fut = w.pending.pop(msg["id"], None)
                w.handlers.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    # A world's strings come from cells and replies: valid UTF-8 from here on (envs_py/text.py).
                    fut.set_result(valid_tree(msg["value"])) if msg["ok"] else fut.set_exception(
                        _valid_error(msg["error"]))
        except (asyncio.IncompleteReadError, ConnectionError, EOFError, pickle.UnpicklingError):
            pass
        self._worker_died(w)

    def _worker_died(self, w: _Worker) -> None:
        if not w.alive:
            return
        w.alive = False
        code = w.proc.poll()
        if code is None:
            w.proc.kill()
            code = w.proc.wait()
        trees = sorted(w.trees)
        why = f"env worker {w.index} (pid {w.proc.pid}) died (exit code {code}); its trees failed: {trees}"
        for t in trees:
            self.failed[t] = why
        for fut in w.pending.values():
            if not fut.done():
                fut.set_exception(WorkerDied(why))
        w.pending.clear()
        w.writer.close()
        if self.workers[w.index] is w:
            self.workers[w.index] = None
            self._spawning[w.index] = asyncio.ensure_future(self._spawn(w.index))  # replace it now

    async def _answer_callback(self, w: _Worker, msg: dict) -> None:
        handler = w.handlers.get(msg["rid"])
        try:
            if handler is None:
                raise RuntimeError(f"no handler for callback {msg['name']!r}")
            payload = dict(valid_tree(msg["payload"]))
            value = await handler(payload.pop("agent_id"), payload)
            reply = {"cb": msg["cb"], "ok": True, "value": value}
        except Exception as e:  # noqa: BLE001  (the cell sees the error string)
            reply = {"cb": msg["cb"], "ok": False, "error": RuntimeError(f"{type(e).__name__}: {e}")}
        if w.alive:
            w.writer.write(_frame(reply))

    async def _request(self, w: _Worker, req: dict, handler: Callable | None = None) -> Any:
        rid = next(self.ids)
        req["id"] = rid
        fut = asyncio.get_running_loop().create_future()
        w.pending[rid] = fut
        if handler is not None:
            w.handlers[rid] = handler
        w.writer.write(_frame(req))
        return await fut

    async def _tree_request(self, tree_id: str, req: dict, handler: Callable | None = None) -> Any:
        if tree_id in self.failed:
            raise TreeFailed(self.failed[tree_id])
        i = self.tree_worker.get(tree_id)
        if i is None:
            raise KeyError(f"unknown tree {tree_id!r}")
        w = self.workers[i]
        if w is None or not w.alive:
            raise TreeFailed(self.failed.get(tree_id, f"the worker of tree {tree_id!r} is gone"))
        return await self._request(w, {**req, "tree": tree_id}, handler)

    # -- public API -------------------------------------------------------------------------------------------
    async def create(self, tree_id: str, env: str, task: Any, **kwargs) -> None:
        """Creates a tree on the next worker (round robin) with the env's factory; returns None."""
        i = next(self._rr) % self.n
        w = await self._live_worker(i)
        self.tree_worker[tree_id] = i
        self.failed.pop(tree_id, None)
        w.trees.add(tree_id)
        await self._request(w, {"op": "create", "tree": tree_id, "env": env, "task": task, "kwargs": kwargs})

    async def call(self, tree_id: str, method: str, *args, **kwargs) -> Any:
        """Calls a public method of the hosted tree; returns its (picklable) value."""
        return await self._tree_request(tree_id, {"op": "call", "method": method, "args": args, "kwargs": kwargs})

    async def run_cell(self, tree_id: str, agent_id: str, code: str,
                       launch: Callable[[str, dict], Awaitable[str]] | None = None) -> Any:
        """Runs an agent's code cell in its sandbox; returns the tree's cell result (a dict for TextCraft)."""
        return await self._tree_request(tree_id, {"op": "run_cell", "agent": agent_id, "code": code}, launch)

    async def fork(self, tree_id: str, new_tree_id: str) -> None:
        """Forks a tree into an isolated branch on the same worker; returns None."""
        await self._tree_request(tree_id, {"op": "fork", "new": new_tree_id})
        self.tree_worker[new_tree_id] = self.tree_worker[tree_id]
        self.workers[self.tree_worker[tree_id]].trees.add(new_tree_id)

    async def commit(self, tree_id: str, branch_id: str) -> None:
        """Makes a tree's state equal its branch's; returns None."""
        await self._tree_request(tree_id, {"op": "commit", "branch": branch_id})

    async def drop(self, tree_id: str) -> None:
        """Frees a tree (and its sandboxes); returns None. Failed trees are just forgotten."""
        if tree_id not in self.failed:
            await self._tree_request(tree_id, {"op": "drop"})
        i = self.tree_worker.pop(tree_id, None)
        self.failed.pop(tree_id, None)
        if i is not None and self.workers[i] is not None:
            self.workers[i].trees.discard(tree_id)

    def worker_pid(self, tree_id: str) -> int | None:
        """Returns the pid of the worker hosting a tree (None if unknown)."""
        i = self.tree_worker.get(tree_id)
        w = self.workers[i] if i is not None else None
        return w.proc.pid if w is not None else None

    async def close(self) -> None:
        """Stops every worker."""
        for w in self.workers:
            if w is not None:
                w.alive = False
                w.writer.close()
                if w.reader_task is not None:
                    w.reader_task.cancel()
                try:
                    w.proc.terminate()
                    w.proc.wait(timeout=5)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    w.proc.kill()
        for t in self._spawning.values():
            t.cancel()

    async def __aenter__(self) -> "WorkerPool":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()


if __name__ == "__main__":
    import signal

    # Ctrl-C in a terminal reaches the whole process group. The parent owns its workers and stops them on its way
    # out (close: SIGTERM), after its own save: a worker ignores SIGINT instead of dying mid-request with a
    # KeyboardInterrupt traceback. A parent that dies outright closes the socket, which ends the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve(int(sys.argv[1]), json.loads(sys.argv[2])))

"""One engine per local device, with task groups pinned to an engine: the sampling layout "a bf16 replica per device".

A single engine over a host's devices with rows split over ``data`` would share one KV pool replicated on every
device (``SAMPLE_RULES``), so a host would hold one device's worth of cached context however many devices it has.
Independent engines each own their device's pool and driver thread: an 8-GPU host holds 8 pools and runs 8 decode
loops that never wait for each other.

Prefix caching works inside one engine, so requests that share prefixes must meet there: ``pinned()`` assigns the
calling asyncio task (and every task it creates afterwards, which inherit its context) to the engine with the fewest
pins, and ``generate`` sends pinned requests to that engine. A task group's 8 trees share the system prompt, the task
and, at a delegation point, the 8 branches of a fork, so the run pins one group at a time. Unpinned requests go to the
engine with the fewest pins and requests in flight (correct anywhere; only their prefix reuse is lost).

    engines = EngineReplicas.build(cfg, params, engine_config, devices=jax.local_devices(), tokenizer=tok)
    with engines.pinned():
        result = await engines.generate(prompt_ids, sampling, key=key)
    engines.load_weights(new_params)   # every replica; one version for all
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Callable, Iterator, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from sera_jax.model.config import Qwen3Config
from sera_jax.parallel.mesh import MeshConfig, make_mesh
from sera_jax.sampling.engine import Engine
from sera_jax.sampling.engine_config import EngineConfig
from sera_jax.sampling.publish import publish_fn
from sera_jax.sampling.types import GenerationResult, SamplingParams


def local_copy(params):
    """Returns ``params`` as arrays on this process's first local device of their mesh (unchanged when this process
    holds them whole). In a multi-host job the trainer's FSDP shards live on every host: one collective program
    replicates them (every process must call this at the same point), and this process keeps its device's copy —
    what an engine or a frozen judge is built from."""
    leaves = jax.tree.leaves(params)
    if not leaves or getattr(leaves[0], "is_fully_addressable", True):
        return params
    mesh = leaves[0].sharding.mesh
    out = publish_fn(leaves[0].dtype.name, jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), params))(params)
    dev = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
    return jax.tree.map(lambda a: next(s.data for s in a.addressable_shards if s.device == dev), out)


class EngineReplicas:
    """The ``Generator`` API (``generate``, ``load_weights``, ``version``, ``close``) over independent engines."""

    def __init__(self, engines: Sequence[Engine]):
        if not engines:
            raise ValueError("EngineReplicas needs at least one engine")
        versions = {e.version for e in engines}
        if len(versions) != 1:
            raise ValueError(f"engines serve different policy versions {sorted(versions)}")
        self.engines = list(engines)
        self._pins = [0] * len(self.engines)
        self._in_flight = [0] * len(self.engines)
        self._lock = threading.Lock()
        self._pinned: contextvars.ContextVar[int | None] = contextvars.ContextVar(f"sera_engine_pin_{id(self)}",
                                                                                  default=None)

    @classmethod
    def build(cls, cfg: Qwen3Config, params, config: EngineConfig, *, devices: Sequence[Any],
              tokenizer: Any = None, seed: int = 0, make: Callable[..., Engine] = Engine) -> "EngineReplicas":
        """Returns one single-device engine per device of ``devices`` (each its own KV pool of ``config``'s size);
        engine i seeds its key-less requests with ``seed + i``. ``make`` builds each engine (``Engine``'s
        signature; a simulated device's engine, ``simulated_engine.SimulatedEngine`` with its timer and script)."""
        devices = list(devices)
        if not devices:
            raise ValueError("EngineReplicas.build needs at least one device")
        engines = []
        try:
            for i, dev in enumerate(devices):
                engines.append(make(cfg, params, config, mesh=make_mesh(MeshConfig(1, 1, 1), [dev]),
                                    tokenizer=tokenizer, seed=seed + i))
        except BaseException:
            for e in engines:
                e.close()
            raise
        return cls(engines)

    def __len__(self) -> int:
        return len(self.engines)

    def _least_loaded(self, *, count_requests: bool) -> int:
        load = [p + (r if count_requests else 0) for p, r in zip(self._pins, self._in_flight)]
        return min(range(len(load)), key=lambda i: (load[i], i))

    @contextlib.contextmanager
    def pinned(self) -> Iterator[Engine]:
        """Pins the current context (an asyncio task and the tasks it creates from now on) to the engine with the
        fewest pins; yields that engine. Nested use keeps the outer pin."""
        outer = self._pinned.get()
        if outer is not None:
            yield self.engines[outer]
            return
        with self._lock:
            i = self._least_loaded(count_requests=False)
            self._pins[i] += 1
        token = self._pinned.set(i)
        try:
            yield self.engines[i]
        finally:
            self._pinned.reset(token)
            with self._lock:
                self._pins[i] -= 1

    def pinned_engine(self) -> Engine | None:
        """Returns the engine the current context is pinned to, if any."""
        i = self._pinned.get()
        return None if i is None else self.engines[i]

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                       key: jax.Array | None = None) -> GenerationResult:
        """``Engine.generate`` on the pinned engine (unpinned: the least-loaded one)."""
        i = self._pinned.get()
        with self._lock:
            if i is None:
                i = self._least_loaded(count_requests=True)
            self._in_flight[i] += 1
        try:
            return await self.engines[i].generate(prompt_ids, params, key)
        finally:
            with self._lock:
                self._in_flight[i] -= 1

    def load_weights(self, params) -> int:
        """Installs new weights in every engine; returns the (common) new version.

        When ``params`` live on a mesh whose local devices are exactly the engines' (the trainer's FSDP layout with
        one engine per device), one jitted program casts them where they are sharded and replicates them on every
        device (``training.step.publish_fn``'s executable; ``sera-profile --aot`` compiles it for the target), and
        each engine takes its device's copy. Otherwise each engine casts and copies them itself.
        """
        placed = self._publish(params)
        if placed is None:
            versions = {e.load_weights(params) for e in self.engines}
        else:
            versions = {e.load_weights(p, owned=True) for e, p in zip(self.engines, placed)}
        if len(versions) != 1:
            raise RuntimeError(f"engine replicas disagree on the policy version: {sorted(versions)}")
        return versions.pop()

    def _publish(self, params) -> list | None:
        leaves = jax.tree.leaves(params)
        sharding = getattr(leaves[0], "sharding", None) if leaves else None
        if not isinstance(sharding, NamedSharding):
            return None
        mesh = sharding.mesh
        devices = [e.mesh.devices.flat[0] for e in self.engines]
        local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
        if not set(d.id for d in devices) <= set(d.id for d in local):
            return None
        if sorted(d.id for d in devices) != sorted(d.id for d in local) and leaves[0].is_fully_addressable:
            return None  # one process, engines on some of its devices: each engine copies the weights itself
        # (Several processes: the replicating program is collective, so every process runs it whatever its engines.)
        out = publish_fn(self.engines[0].cfg.dtype, jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()),
                                                                  params))(params)
        return [jax.tree.map(lambda a, d=d: next(s.data for s in a.addressable_shards if s.device == d), out)
                for d in devices]

    def warmup(self, params=None) -> int:
        """Compiles every shape bucket of every engine now (``Engine.warmup``) and, given trainer ``params``, the
        publish of such weights (nothing is installed); returns the engines' new compilations."""
        n = sum(e.warmup() for e in self.engines)
        if params is not None:
            placed = self._publish(params)
            if placed is None:
                for e in self.engines:
                    e.warm_publish(params)
            else:
                jax.block_until_ready(placed)
        return n

    @property
    def version(self) -> int:
        return self.engines[0].version

    def stats(self) -> list[dict[str, int]]:
        """Returns each engine's ``Engine.stats()``."""
        return [e.stats() for e in self.engines]

    def close(self) -> None:
        for e in self.engines:
            e.close()

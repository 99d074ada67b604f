"""The host side of one training step's rollouts at full scale, measured against simulated GPUs.

The step's task groups run through the training loop's own ``GroupRunner`` (runtime, launchers, rubric and score
calls, counterfactual forks, env workers, sandboxes) on one ``SimulatedEngine`` per simulated GPU, then the loop's
credit (``rl.baselines.task_group_credit``) and batch packing (``training.step_batch.build_batch``). What the device
would do is the roofline's time (``simulated_time``); everything else is real and is what is measured:

* wall time against the device time the engines needed (their simulated busy seconds) and against the projection's
  floors (``projection.rollout_floors``) for the measured tree shape;
* each simulated GPU's busy fraction; the event loop's busy fraction (its thread's CPU seconds over the wall) and its
  longest stalls (how late a 5 ms timer fired);
* host CPU seconds by component: the event loop (runtime, prompts, parsing; tokenisation separately), the engine
  drivers (scheduler, block manager, stop handling), the env workers and their sandboxes (child processes, from
  /proc), credit and batch packing; the simulation's own costs (the oracle script, the numpy stand-ins of the device
  programs) are counted apart and left out of the host's figures;
* host CPU µs per generated token and per engine call (agent turns and side calls).

Figures from a shared machine are noisy: its other load takes cores from the host path and slows it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import resource
import threading
import time
from typing import Any, Sequence

import jax

from sera_jax.agents.runtime import start_pool
from sera_jax.assembly.engines import engine_maker, num_engines, simulated_engine_config, simulation
from sera_jax.assembly.settings import runtime_settings
from sera_jax.config import RunConfig
from sera_jax.profiling.projection import TreeShape, rollout_floors
from sera_jax.profiling.targets import get_target
from sera_jax.rl.baselines import task_group_credit
from sera_jax.sampling.replicas import EngineReplicas
from sera_jax.training.group_runner import GroupRunner
from sera_jax.training.step_batch import build_batch

TICKS = os.sysconf("SC_CLK_TCK")


class CountingTokenizer:
    """A tokenizer whose encode/decode CPU seconds are counted by the thread kind that called them."""

    def __init__(self, tokenizer: Any, loop_thread: int):
        self._tok, self._loop_thread = tokenizer, loop_thread
        self.cpu_s: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def _timed(self, name: str, *args, **kw):
        t0 = time.thread_time()
        try:
            return getattr(self._tok, name)(*args, **kw)
        finally:
            kind = ("loop" if threading.get_ident() == self._loop_thread else
                    "driver" if threading.current_thread().name == "sera-engine-driver" else "executor")
            self.cpu_s[f"{name}/{kind}"] += time.thread_time() - t0
            self.calls[f"{name}/{kind}"] += 1

    def encode(self, *args, **kw):
        return self._timed("encode", *args, **kw)

    def decode(self, *args, **kw):
        return self._timed("decode", *args, **kw)

    def encode_chat(self, *args, **kw):
        return self._timed("encode_chat", *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


class LoopWatch:
    """The event loop's busy fraction (its thread's CPU seconds over the wall) and its stalls: how late a timer of
    ``interval`` seconds fires (a late timer is a callback that held the loop)."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.lags = interval, []
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags.append(time.perf_counter() - t - self.interval)

    def start(self) -> None:
        self.cpu0, self.wall0 = time.thread_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def stop(self) -> dict[str, Any]:
        self._task.cancel()
        cpu, wall = time.thread_time() - self.cpu0, time.perf_counter() - self.wall0
        lags = sorted(self.lags, reverse=True)
        return {"loop_cpu_s": cpu, "loop_busy_fraction": cpu / wall if wall else 0.0,
                "loop_longest_stalls_ms": [round(x * 1e3, 2) for x in lags[:5]],
                "loop_stalls_over_10ms": sum(x > 0.010 for x in lags)}


def _thread_cpu() -> dict[str, float]:
    """Returns CPU seconds of this process's threads, summed by thread name (from /proc)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: collections.Counter = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[names.get(int(tid), "other")] += (int(fields[11]) + int(fields[12])) / TICKS
    return dict(out)


def _descendants_cpu() -> dict[str, float]:
    """Returns CPU seconds of this process's descendants: their own ("own") and their reaped children's ("reaped",
    e.g. sandbox cells an env worker waited for)."""
    stats = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(pid)] = (int(fields[1]), [int(x) for x in fields[11:15]])
    children = collections.defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    own = reaped = 0
    todo = list(children[os.getpid()])
    while todo:
        pid = todo.pop()
        _, (ut, st, cut, cst) = stats[pid]
        own, reaped = own + ut + st, reaped + cut + cst
        todo += children[pid]
    return {"own": own / TICKS, "reaped": reaped / TICKS}


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def tree_shape(trees: Sequence[Any], engine_calls: int, generated: int) -> TreeShape:
    """Returns the measured shape of ``trees`` in ``projection.TreeShape``'s terms (side calls counted as agents'
    turns, as it counts them)."""
    nodes = [n for t in trees for n in t.nodes.values()]
    firsts = [len(n.turns[0].prompt_ids) for n in nodes if n.turns]
    obs = [len(b.prompt_ids) - len(a.prompt_ids) - len(a.completion_ids)
           for n in nodes for a, b in zip(n.turns, n.turns[1:])]
    depth = [max(n.depth for n in t.nodes.values()) + 1 for t in trees]
    agents = len(nodes) / max(1, len(trees))
    return TreeShape(agents=agents, turns_per_agent=engine_calls / max(1, len(nodes)),
                     system_tokens=int(sum(firsts) / max(1, len(firsts))),
                     completion_tokens=int(round(generated / max(1, engine_calls))),
                     observation_tokens=int(round(sum(obs) / max(1, len(obs)))),
                     sequential_agents=sum(depth) / max(1, len(depth)))


@dataclasses.dataclass
class StepReport:
    figures: dict[str, Any]
    trees: list


async def simulated_step(cfg: RunConfig, tasks: Sequence[Any], tokenizer: Any, *, stage: str, version: int = 0,
                         ranks: Sequence[int] | None = None) -> StepReport:
    """Runs one step's task groups (``tasks``, one group each; ``ranks``: this process's share of them) at
    ``stage`` on the simulated GPUs of the installed simulation; returns the step's figures (module docstring)."""
    sim = simulation(cfg)
    if sim is None:
        raise ValueError("simulated_step needs engine.backend: simulated and a simulated device installed")
    model_cfg = cfg.model_config()
    tok = CountingTokenizer(tokenizer, threading.get_ident())
    n = num_engines(cfg, jax.local_devices())
    engines = EngineReplicas.build(model_cfg, None, simulated_engine_config(cfg, n), devices=[jax.local_devices()[0]] * n,
                                   tokenizer=tok, seed=cfg.train.seed, make=engine_maker(cfg, tokenizer))
    method = cfg.method_config()
    pool = await start_pool(cfg.env.num_workers)
    mine = [t for i, t in enumerate(tasks) if ranks is None or i in ranks]
    try:
        runner = GroupRunner(cfg, method, engines, tok, runtime_settings(cfg), pool=pool)
        watch = LoopWatch()
        threads0, kids0, proc0 = _thread_cpu(), _descendants_cpu(), _process_cpu()
        watch.start()
        t0 = time.perf_counter()
        group_s = []

        async def one(task):
            g0 = time.perf_counter()
            trees = await runner(task, stage, version)
            group_s.append(time.perf_counter() - g0)
            return trees

        groups = await asyncio.gather(*(one(t) for t in mine))
        rollout_s = time.perf_counter() - t0
        loop = watch.stop()
        threads1, kids1 = _thread_cpu(), _descendants_cpu()
        c0 = time.process_time()
        credits = [task_group_credit(stage, trees, method, decode=tokenizer.decode, env=cfg.env.name,
                                     filter_zero_variance=cfg.execution_filter_zero_variance()
                                     if stage == "execution" else None) for trees in groups]
        credit_cpu = time.process_time() - c0
        c0 = time.process_time()
        _, batch_info = build_batch(credits, method, min_trainable=1, token_budget=cfg.batch.token_budget,
                                    buckets=cfg.batch.buckets, row_multiple=8, advantage_clip=cfg.batch.advantage_clip)
        batch_cpu = time.process_time() - c0
        proc1 = _process_cpu()
    finally:
        await pool.close()
        stats = engines.stats()
        engines.close()
    trees = [t for g in groups for t in g]
    calls = sum(s["admitted"] for s in stats)
    generated = sum(s["generated_tokens"] for s in stats)
    script_s = sum(s["script_s"] for s in stats)
    programs_s = sum(s["simulated_programs_cpu_s"] for s in stats)
    busy = [s["simulated_busy_s"] for s in stats]
    drivers = threads1.get("sera-engine-driver", 0.0) - threads0.get("sera-engine-driver", 0.0)
    clocks = threads1.get("sera-device-clock", 0.0) - threads0.get("sera-device-clock", 0.0)
    tokenise = dict(tok.cpu_s)
    tok_loop = sum(v for k, v in tokenise.items() if k.endswith("/loop"))
    tok_driver = sum(v for k, v in tokenise.items() if k.endswith("/driver"))
    tok_executor = sum(v for k, v in tokenise.items() if k.endswith("/executor"))
    env_own, sandboxes = kids1["own"] - kids0["own"], kids1["reaped"] - kids0["reaped"]
    # The host's CPU: this process's, less what only the simulation spends, plus its env workers and sandboxes.
    proc_rollout = proc1 - proc0 - credit_cpu - batch_cpu
    host_rollout = proc_rollout - script_s - programs_s + env_own + sandboxes
    components = {
        "runtime (event loop, less tokenisation and the script)": loop["loop_cpu_s"] - tok_loop - script_s,
        "tokenisation (event loop)": tok_loop,
        "scheduler + block manager + stop handling (engine drivers, less the stand-ins)":
            max(0.0, drivers - programs_s - tok_driver),
        "stop-string decoding (engine drivers)": tok_driver,
        "device clock watchers": clocks,
        "tokenisation (asyncio executor threads: prompt truncation)": tok_executor,
        "other threads (executors less tokenisation; XLA's pools: the turns' key derivations)":
            max(0.0, proc_rollout - loop["loop_cpu_s"] - drivers - clocks - tok_executor),
        "env workers + sandboxes (live descendant processes)": env_own,
        "exited descendants (cells their parents reaped)": sandboxes,
        "credit": credit_cpu,
        "batch packing": batch_cpu,
        "HTTP (judge client)": 0.0,
    }
    shape = tree_shape(trees, calls, generated)
    gpu = get_target(sim.target)
    _, _, floor_tp, floor_lat = rollout_floors(model_cfg, gpu, trees_per_step=len(trees), gpus=n,
                                               decode_rows=64, tree=shape)
    figures = {
        "simulated": sim.target, "stage": stage, "groups": len(mine), "trees": len(trees), "simulated_gpus": n,
        "rollout_wall_s": rollout_s, "group_wall_s": sorted(group_s),
        "device_busy_max_s": max(busy), "device_busy_s": busy,
        "gpu_busy_fraction": [b / rollout_s for b in busy],
        "projection_floor_s": max(floor_tp, floor_lat), "projection_throughput_floor_s": floor_tp,
        "projection_latency_floor_s": floor_lat,
        **loop,
        "engine_calls": calls, "generated_tokens": generated,
        "prefill_tokens": sum(s["prefill_tokens"] for s in stats),
        "cached_tokens": sum(s["cached_tokens"] for s in stats),
        "host_cpu_s": {k: round(v, 3) for k, v in components.items()},
        "host_rollout_cpu_s": host_rollout,
        "host_us_per_token": 1e6 * host_rollout / max(1, generated),
        "host_us_per_call": 1e6 * host_rollout / max(1, calls),
        "simulation_cpu_s": {"oracle script": script_s, "device program stand-ins": programs_s},
        "tokenizer_calls": dict(tok.calls), "tokenizer_cpu_s": {k: round(v, 3) for k, v in tokenise.items()},
        "threads_cpu_s": {k: round(threads1.get(k, 0.0) - threads0.get(k, 0.0), 3) for k in threads1},
        "tree_shape": dataclasses.asdict(shape), "assumed_tree_shape": dataclasses.asdict(TreeShape()),
        "root_success": sum(t.root.reward.environment or 0.0 for t in trees) / max(1, len(trees)),
        "datums": batch_info.get("datums"), "trainable_datums": batch_info.get("trainable_datums"),
    }
    return StepReport(figures, trees)


def summary(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Returns the headline figures of one step's processes' reports (each ``simulated_step``'s figures)."""
    busy = [f for x in parts for f in x["gpu_busy_fraction"]]
    calls = sum(x["engine_calls"] for x in parts)
    gen = sum(x["generated_tokens"] for x in parts)
    host = sum(x["host_rollout_cpu_s"] for x in parts)
    return {"simulated": parts[0]["simulated"], "stage": parts[0]["stage"], "processes": len(parts),
            "trees": sum(x["trees"] for x in parts), "wall_s": round(max(x["rollout_wall_s"] for x in parts), 3),
            "device_busy_max_s": round(max(x["device_busy_max_s"] for x in parts), 3),
            "floor_s": round(max(x["projection_floor_s"] for x in parts), 3),
            "gpu_busy_mean": round(sum(busy) / len(busy), 4),
            "loop_busy": round(max(x["loop_busy_fraction"] for x in parts), 4),
            "host_us_per_token": round(1e6 * host / max(1, gen), 1),
            "host_us_per_call": round(1e6 * host / max(1, calls))}


def result_line(parts: Sequence[dict[str, Any]], **extra: Any) -> str:
    """Returns the ``RESULT simulated=GPU ...`` line of a step's reports."""
    return "RESULT " + " ".join(f"{k}={v}" for k, v in {**summary(parts), **extra}.items())

"""``sera-serve`` under load: 64 concurrent ``openai``-client users against the engine alone on the same requests.

Usage: ``python tools/bench_serve.py [--quick] [--users N] [--requests R] [--new-tokens T]``.

The shipped tiny warm start (imported as a run with ``sera-export --import``) is served by a ``sera-serve`` process
on 127.0.0.1 with ``--max-batch`` = the number of users. Each user sends R streamed chat requests one after another
(distinct TextCraft-like goals, so prompts share the system prompt's prefix only), greedy, ``ignore_eos`` so every
completion is T tokens, through the real ``openai`` async client, all users at once. The engine alone runs the same
prompt ids with the same sampling and the same engine sizes in this process, the users as asyncio tasks awaiting
``engine.generate``. Each side runs the workload twice, untimed then timed (compilation excluded; fresh goals in the
timed pass, so it reuses no cached prefix the warm-up made); the clients live across both passes, as users' would,
so connection set-up is not timed.

Printed side by side: throughput (completion tokens/s over the pass), time to first token p50/p99 (request sent →
first content chunk; for the engine alone, the first round's tokens via ``on_progress``), per-token latency p50/p99
(first → last token over the tokens between), errors, and the machine's fp32 matmul rate on the model's largest
projection (as ``tools/bench_decode.py`` measures it). Client and server share this machine's cores: the client's
own JSON/SSE work is part of what the ratio measures. With ``--pin`` they do not: the engine alone and the server
each get the first core of this process's CPU set, every thread of them, and the client the others, so the ratio
compares the server with the engine on equal compute. Ends with a RESULT line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

import httpx
import numpy as np

from sera_jax.interop.export import import_pretrained
from sera_jax.profiling.machine import matmul_rate
from sera_jax.sampling import Engine, SamplingParams
from sera_jax.serving.policy import load_served_policy
from sera_jax.serving.process import serve_process
from sera_jax.serving.server import ServeOptions, engine_config
from sera_jax.warmstart.sft import SHIPPED_DIRS

ITEMS = ["oak planks", "stick", "crafting table", "wooden pickaxe", "iron ingot", "torch", "chest", "ladder",
         "bowl", "furnace", "lever", "stone axe", "birch boat", "oak door", "iron bars", "bucket"]
SYSTEM = "You are a Minecraft crafting agent. Reply with one action per turn."


def messages(user: int, turn: int, salt: int) -> list[dict]:
    """Returns user ``user``'s request ``turn`` (``salt`` makes another pass's goals distinct)."""
    item = ITEMS[(user + turn) % len(ITEMS)]
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Goal {salt}-{user}-{turn}: craft {1 + user % 4} {item}."}]


def pin(pid: int, cores: set[int]) -> None:
    """Moves every thread of process ``pid`` (0: this one) onto ``cores``; threads it starts later inherit them."""
    for tid in os.listdir(f"/proc/{pid or os.getpid()}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def cpu_seconds(pid: int | None = None) -> float:
    """Returns the CPU seconds (user + system) a process has used so far (this one by default)."""
    if pid is None:
        return time.process_time()
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pass:
    """One pass's per-request figures: TTFT, per-token latency, completion tokens, errors, wall time, and the CPU
    seconds the server process and this (client) process used."""

    def __init__(self) -> None:
        self.ttft, self.tpot, self.tokens, self.errors, self.wall = [], [], 0, 0, 0.0
        self.server_cpu = self.client_cpu = 0.0
        self.chunks = 0  # server-sent events the client parsed (the served pass)

    def add(self, sent: float, first: float | None, last: float | None, tokens: int) -> None:
        if first is None:
            self.errors += 1
            return
        self.ttft.append(first - sent)
        if tokens > 1 and last is not None:
            self.tpot.append((last - first) / (tokens - 1))
        self.tokens += tokens

    def row(self) -> dict:
        q = (lambda xs, p: float(np.percentile(xs, p)) * 1e3 if xs else float("nan"))
        return {"tps": self.tokens / self.wall if self.wall else 0.0, "ttft50": q(self.ttft, 50),
                "ttft99": q(self.ttft, 99), "tpot50": q(self.tpot, 50), "tpot99": q(self.tpot, 99),
                "errors": self.errors, "tokens": self.tokens, "wall": self.wall, "server_cpu": self.server_cpu,
                "client_cpu": self.client_cpu, "chunks": self.chunks}


async def engine_pass(engine: Engine, tok, users: int, requests: int, new_tokens: int, salt: int) -> Pass:
    out = Pass()
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)   # no stop ids: as ignore_eos

    async def user(u: int) -> None:
        for r in range(requests):
            ids = tok.encode_chat(messages(u, r, salt))
            sent, seen = time.perf_counter(), {}

            def progress(toks, lps):
                seen.setdefault("first", time.perf_counter())
            try:
                res = await engine.generate(ids, sp, on_progress=progress)
            except Exception:  # noqa: BLE001  (counted, as the client side counts its errors)
                out.add(sent, None, None, 0)
                continue
            done = time.perf_counter()
            first = seen.get("first", done)
            out.add(sent, first, done, len(res.token_ids))

    t0, cpu0 = time.perf_counter(), cpu_seconds()
    await asyncio.gather(*(user(u) for u in range(users)))
    out.wall = time.perf_counter() - t0
    out.server_cpu = cpu_seconds() - cpu0
    return out


async def serve_pass(client, model: str, users: int, requests: int, new_tokens: int, salt: int, pid: int) -> Pass:
    out = Pass()

    async def user(u: int) -> None:
        for r in range(requests):
            sent, first, last, tokens = time.perf_counter(), None, None, 0
            try:
                stream = await client.chat.completions.create(
                    model=model, messages=messages(u, r, salt), max_tokens=new_tokens, temperature=0, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                async for chunk in stream:
                    now = time.perf_counter()
                    out.chunks += 1
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                    if any(c.delta.content for c in chunk.choices):
                        first = first or now
                        last = now
            except Exception as e:  # noqa: BLE001  (an error is a counted figure of the benchmark)
                print(f"request error: {type(e).__name__}: {e}", file=sys.stderr)
                first = None
            out.add(sent, first if tokens else None, last, tokens)

    t0, server0, client0 = time.perf_counter(), cpu_seconds(pid), cpu_seconds()
    await asyncio.gather(*(user(u) for u in range(users)))
    out.wall = time.perf_counter() - t0
    out.server_cpu, out.client_cpu = cpu_seconds(pid) - server0, cpu_seconds() - client0
    return out


async def serve_passes(url: str, model: str, users: int, requests: int, new_tokens: int, pid: int) -> Pass:
    """Returns the timed pass after an untimed one, by the same long-lived clients (their connections open)."""
    import openai

    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=users + 8), timeout=600)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, http_client=http)
    try:
        await serve_pass(client, model, users, requests, new_tokens, 0, pid)
        return await serve_pass(client, model, users, requests, new_tokens, 1, pid)
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 users, 2 requests, 16 tokens (a smoke run)")
    ap.add_argument("--users", type=int, default=None, help="concurrent users (default 64, quick 4)")
    ap.add_argument("--requests", type=int, default=None, help="requests per user (default 4, quick 2)")
    ap.add_argument("--new-tokens", type=int, default=None, help="completion tokens (default 64, quick 16)")
    ap.add_argument("--pin", action="store_true",
                    help="engine alone and server on one core, the client on the others (equal compute)")
    ap.add_argument("--max-top-logprobs", type=int, default=ServeOptions.max_top_logprobs,
                    help="alternatives both engines compute beside each token (default: the server's)")
    args = ap.parse_args()
    users = args.users or (4 if args.quick else 64)
    requests = args.requests or (2 if args.quick else 4)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    context = 256 if args.quick else 512
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        ap.error("--pin needs at least 2 cores")
    engine_cores, client_cores = ({cores[0]}, set(cores[1:])) if args.pin else (set(cores), set(cores))

    with tempfile.TemporaryDirectory() as tmp:
        run = import_pretrained(SHIPPED_DIRS["textcraft"], os.path.join(tmp, "tiny_run"))
        policy = load_served_policy(run)
        opts = ServeOptions(max_batch=users, max_context=context, max_top_logprobs=args.max_top_logprobs)
        rate = matmul_rate(policy.model_cfg)

        pin(0, engine_cores)
        engine = Engine(policy.model_cfg, policy.params, engine_config(policy.model_cfg, opts),
                        tokenizer=policy.tokenizer)
        try:
            compiles0 = engine.compile_count()
            asyncio.run(engine_pass(engine, policy.tokenizer, users, requests, new_tokens, salt=0))
            alone = asyncio.run(engine_pass(engine, policy.tokenizer, users, requests, new_tokens, salt=1)).row()
            alone["compiles"] = engine.compile_count() - compiles0
        finally:
            engine.close()

        proc = serve_process([str(run)], "--max-batch", str(users), "--max-context", str(context),
                             "--max-top-logprobs", str(args.max_top_logprobs))
        pin(proc.proc.pid, engine_cores)
        pin(0, client_cores)
        try:
            model = policy.name
            compiles0 = httpx.get(proc.url + "/metrics").json()["engine"]["compiles"]
            served = asyncio.run(serve_passes(proc.url, model, users, requests, new_tokens, proc.proc.pid)).row()
            # both passes' compilations: the warm-up pass compiles what the timed one needs
            served["compiles"] = httpx.get(proc.url + "/metrics").json()["engine"]["compiles"] - compiles0
        finally:
            proc.stop()

    ratio = served["tps"] / alone["tps"] if alone["tps"] else 0.0
    placement = (f"engine alone and server pinned to core {cores[0]}, client to {sorted(client_cores)}"
                 if args.pin else "client and server sharing every core")
    print(f"sera-serve vs the engine alone: {users} concurrent users x {requests} streamed chat requests, "
          f"{new_tokens} tokens each (greedy, ignore_eos), the shipped tiny warm start, engine rows {users}, "
          f"top logprobs computed {args.max_top_logprobs}; {placement}; "
          f"machine fp32 matmul rate {rate / 1e9:.0f} GFLOP/s")
    print("| | tokens/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | per-token p99 ms | errors | wall s | "
          "engine/server CPU s | client CPU s | compiles (both passes) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in (("sera-serve (openai client)", served), ("engine alone", alone)):
        print(f"| {name} | {r['tps']:.0f} | {r['ttft50']:.0f} | {r['ttft99']:.0f} | {r['tpot50']:.1f} | "
              f"{r['tpot99']:.1f} | {r['errors']} | {r['wall']:.2f} | {r['server_cpu']:.2f} | "
              f"{r['client_cpu']:.2f} | {r['compiles']} |")
    print(f"throughput ratio sera-serve / engine alone: {ratio:.2f} (goal >= 0.8); server-sent events parsed by the "
          f"client: {served['chunks'] / max(1, users * requests):.1f} per request")
    print(f"RESULT users={users} requests={requests} new_tokens={new_tokens} serve_tps={served['tps']:.1f} "
          f"engine_tps={alone['tps']:.1f} ratio={ratio:.3f} serve_ttft_p50_ms={served['ttft50']:.1f} "
          f"serve_ttft_p99_ms={served['ttft99']:.1f} serve_tpot_p50_ms={served['tpot50']:.2f} "
          f"serve_tpot_p99_ms={served['tpot99']:.2f} engine_ttft_p50_ms={alone['ttft50']:.1f} "
          f"engine_ttft_p99_ms={alone['ttft99']:.1f} errors={served['errors']} "
          f"serve_server_cpu_s={served['server_cpu']:.2f} serve_client_cpu_s={served['client_cpu']:.2f} "
          f"engine_cpu_s={alone['server_cpu']:.2f} "
          f"matmul_gflops={rate / 1e9:.1f} quick={int(args.quick)} pinned={int(args.pin)} "
          f"top_logprobs={args.max_top_logprobs} chunks_per_request={served['chunks'] / max(1, users * requests):.1f}")


if __name__ == "__main__":
    main()

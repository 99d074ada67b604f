"""A roofline projection of a paper run's hours on its GPUs — a projection from peaks and stated assumptions, never a
measurement.

* Train step: model FLOPs (``profiling.flops.train_flops``) at the GPUs' dense bf16 peak, and the compiled step's
  collective bytes (``profiling.hlo``) at NVLink within a host and at the cross-host network; the step takes at
  least the largest of the three (everything overlapped) and at most their sum (nothing overlapped).
* Decode: each step reads every weight once plus the K/V of every row's context (``flops.kv_bytes_per_token``), at
  HBM bandwidth; at ``rows`` rows per GPU that gives tokens/s per GPU.
* Rollouts: a step's generated tokens at that rate over all GPUs (throughput floor), and its longest chain of
  sequential turns at the per-step decode latency (latency floor); prompts prefilled at the FLOP peak.

What a tree holds (agents, turns, tokens) is not in the spec: ``TreeShape`` states the assumptions, and the report
prints them beside the result.
"""

from __future__ import annotations

import dataclasses
import math

from sera_jax.model import Qwen3Config
from sera_jax.profiling.flops import forward_flops, kv_bytes_per_token, train_flops
from sera_jax.profiling.targets import GpuTarget


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """Assumed size of one agent tree (TextCraft defaults: the paper's ~1,700-token instructions, turns of a few
    hundred tokens, a root that delegates to two children)."""

    agents: float = 3.0                 # root + sub-agents (+ rubric and score calls counted as agents' turns)
    turns_per_agent: float = 6.0
    system_tokens: int = 1700
    completion_tokens: int = 250        # per turn
    observation_tokens: int = 150       # per turn (tool output, child results)
    sequential_agents: float = 2.0      # agents on the longest chain (a parent waits for its children)

    @property
    def context_tokens(self) -> float:
        """Tokens of one agent's final context (its training datum after prefix merging)."""
        return self.system_tokens + self.turns_per_agent * (self.completion_tokens + self.observation_tokens)

    @property
    def generated_tokens(self) -> float:
        return self.agents * self.turns_per_agent * self.completion_tokens


@dataclasses.dataclass(frozen=True)
class HostCost:
    """Host CPU per engine call (an agent turn or a side call), measured on the simulated paper step
    (``tools/sim_paper_step.py``, docs/results/host_side.md: TextCraft SERA execution stage, 1 process × 8 simulated
    H200s, the oracle's ~61-token turns, after the key-derivation cuts; a loaded 2-core machine, so an upper
    figure). ``in_process_us`` runs in one process under one GIL (event loop, engine drivers, executor threads)
    and cannot use more than one core per process; ``worker_us`` runs in env workers and sandboxes, separate
    processes that use any core."""

    in_process_us: float = 5000.0
    worker_us: float = 3350.0
    cores_per_host: int = 32
    processes_per_host: int = 1

    def step_s(self, calls: float, hosts: int) -> float:
        """Returns the host-bound seconds of ``calls`` engine calls spread over ``hosts`` hosts: the larger of the
        GIL-bound part (one core per process) and all of it over the hosts' cores."""
        gil = calls * self.in_process_us / (hosts * self.processes_per_host)
        cores = calls * (self.in_process_us + self.worker_us) / (hosts * self.cores_per_host)
        return max(gil, cores) / 1e6


@dataclasses.dataclass(frozen=True)
class Projection:
    steps: int
    trees_per_step: int
    gpus: int
    train_tokens: float               # per step
    train_flops: float
    train_compute_s: float
    nvlink_s: float
    network_s: float
    decode_rows: int
    decode_step_s: float              # one decode step of ``decode_rows`` rows at the HBM roofline
    decode_tok_s_per_gpu: float
    rollout_throughput_s: float       # generated tokens / (tok/s per GPU × GPUs) + prefill at peak
    rollout_latency_s: float          # longest chain of turns at the decode step latency
    tree: TreeShape
    host_s: float = 0.0               # host-bound seconds of the step's rollouts (HostCost; 0: not counted)
    host: HostCost | None = None

    @property
    def train_s(self) -> tuple[float, float]:
        """(overlapped, serial) train step time."""
        parts = (self.train_compute_s, self.nvlink_s, self.network_s)
        return max(parts), sum(parts)

    @property
    def step_s(self) -> float:
        """Projected seconds per update: rollouts (the largest of the device floors and the host-bound time) then
        the train step (overlapped)."""
        return max(self.rollout_throughput_s, self.rollout_latency_s, self.host_s) + self.train_s[0]

    @property
    def device_hours(self) -> float:
        """The hours with the host left out (the roofline floor alone)."""
        return self.steps * (max(self.rollout_throughput_s, self.rollout_latency_s) + self.train_s[0]) / 3600

    @property
    def hours(self) -> float:
        return self.steps * self.step_s / 3600


def decode_roofline(cfg: Qwen3Config, target: GpuTarget, rows: int, context: float, itemsize: int = 2
                    ) -> tuple[float, float]:
    """Returns (seconds per decode step, tokens/s per GPU) of ``rows`` rows at mean ``context`` tokens: the weights
    and every row's K/V read once per step at HBM bandwidth (FLOPs are far below the peak at these sizes)."""
    nbytes = cfg.num_params() * itemsize + rows * context * kv_bytes_per_token(cfg, itemsize)
    step = max(nbytes / target.hbm_bytes_per_s, forward_flops(cfg, rows, rows * context) / target.bf16_flops)
    return step, rows / step


def prefill_roofline(cfg: Qwen3Config, target: GpuTarget, tokens: int, context_sum: float, kv_read_tokens: float,
                     kv_write_tokens: float, itemsize: int = 2) -> float:
    """Returns the seconds of one prefill call at the roofline: ``tokens`` computed tokens (the call's padded rows ×
    length: padding is computed too) whose attended positions total ``context_sum``, at the FLOP peak, or the
    weights read once plus ``kv_read_tokens`` cached and ``kv_write_tokens`` new tokens' K/V at HBM bandwidth,
    whichever is longer (the projection's prefill is this call's FLOP term without attention)."""
    kv = kv_bytes_per_token(cfg, itemsize)
    nbytes = cfg.num_params() * itemsize + (kv_read_tokens + kv_write_tokens) * kv
    return max(nbytes / target.hbm_bytes_per_s, forward_flops(cfg, tokens, context_sum) / target.bf16_flops)


def project(cfg: Qwen3Config, target: GpuTarget, *, steps: int, trees_per_step: int, gpus: int,
            within_bytes_per_microbatch: float, across_bytes_per_microbatch: float, token_budget: int,
            network_bytes_per_s: float, decode_rows: int = 64, tree: TreeShape = TreeShape(),
            host: HostCost | None = None, hosts: int = 1) -> Projection:
    """Returns the projection of ``steps`` updates of ``trees_per_step`` trees on ``gpus`` GPUs of ``target``, with
    the compiled step's per-device collective bytes per micro-batch; ``host`` (with the job's ``hosts``) adds the
    host-bound time of the step's engine calls (trees × agents × turns)."""
    datums = trees_per_step * tree.agents
    train_tokens = datums * tree.context_tokens
    loss_tokens = trees_per_step * tree.generated_tokens
    seq = [int(tree.context_tokens)] * int(round(datums))
    flops = train_flops(cfg, seq, loss_tokens=min(int(loss_tokens), sum(seq)))
    micro = max(1, math.ceil(train_tokens / (token_budget * gpus)))
    compute_s = flops / (gpus * target.bf16_flops)
    nvlink_s = micro * within_bytes_per_microbatch / target.nvlink_bytes_per_s
    network_s = micro * across_bytes_per_microbatch / network_bytes_per_s
    step_dec, tok_s, throughput_s, latency_s = rollout_floors(cfg, target, trees_per_step=trees_per_step,
                                                              gpus=gpus, decode_rows=decode_rows, tree=tree)
    host_s = 0.0 if host is None else host.step_s(trees_per_step * tree.agents * tree.turns_per_agent, hosts)
    return Projection(steps, trees_per_step, gpus, train_tokens, flops, compute_s, nvlink_s, network_s, decode_rows,
                      step_dec, tok_s, throughput_s, latency_s, tree, host_s, host)


def rollout_floors(cfg: Qwen3Config, target: GpuTarget, *, trees_per_step: int, gpus: int, decode_rows: int,
                   tree: TreeShape) -> tuple[float, float, float, float]:
    """Returns (decode step s, tokens/s per GPU, throughput floor s, latency floor s) of a step's rollouts: its
    generated tokens at ``decode_rows`` rows per GPU over all GPUs plus its prompts prefilled at the FLOP peak, and
    its longest chain of sequential turns at the decode step latency."""
    mean_ctx = tree.system_tokens + tree.turns_per_agent * (tree.completion_tokens + tree.observation_tokens) / 2
    step_dec, tok_s = decode_roofline(cfg, target, decode_rows, mean_ctx)
    generated = trees_per_step * tree.generated_tokens
    # Prompts are prefilled past the cached prefix: each turn adds its observation (and the system prompt once).
    prefill_tokens = trees_per_step * tree.agents * (tree.system_tokens
                                                     + tree.turns_per_agent * tree.observation_tokens)
    prefill_s = 2.0 * cfg.num_params() * prefill_tokens / (gpus * target.bf16_flops)
    throughput_s = generated / (tok_s * gpus) + prefill_s
    latency_s = tree.sequential_agents * tree.turns_per_agent * tree.completion_tokens * step_dec
    return step_dec, tok_s, throughput_s, latency_s

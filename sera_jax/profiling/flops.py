"""Model FLOPs of a train step and of decoding, the peaks they are divided by, and peak device memory.

Train (MFU of ``sera-profile`` and ``tools/profile_train_step.py``)::

    MFU = model FLOPs per step / step time / (devices × peak),   peak = 989 TFLOP/s per H200 (dense bf16)
    model FLOPs = 6·N·tokens + 6·L·H·E·Σ s²

N the parameter count (tied embedding counted once: the lookup is free, the unembedding matmul is not), tokens the
real (non-padding) tokens, and the attention term the causal QKᵀ and PV products of every packed sequence of length
s (2·s²·H·E forward per layer, ×3 for forward + backward). Remat's recomputation is not counted (that would be HFU),
nor the padding and cross-segment scores the dense kernel skips only by masking. Given the loss tokens, the
unembedding (V·D of N) is counted for them alone: the trainer's head computes log-probabilities only there
(``model.logprobs.chunked_logprobs`` with a mask), so prompt tokens cost 6·(N − V·D) each.

Decode: each generated token costs 2·N (every weight once, forward only) + 4·L·H·E·c (QKᵀ and PV over its c cached
positions). Decoding is bound by memory bandwidth, not FLOPs, so the report also gives the HBM roofline: a decode
step must at least read every weight (in the sampler dtype) and the cached K/V of every row once, at 4.8 TB/s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PEAK_FLOPS = {"gpu": 989e12, "cpu": None}  # per device, dense bf16 (H200 SXM); none claimed for CPU
HBM_BYTES_PER_S = {"gpu": 4.8e12, "cpu": None}  # H200 HBM3e


def train_flops(cfg, seq_lengths: Sequence[int], loss_tokens: int | None = None) -> float:
    """Returns the model FLOPs of one optimizer step over packed sequences of these lengths:
    6·N·Σs + 6·L·H·E·Σs², or with ``loss_tokens`` 6·(N − V·D)·Σs + 6·V·D·loss_tokens + 6·L·H·E·Σs² (see the
    module docstring)."""
    tokens = sum(seq_lengths)
    attn = 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * sum(float(s) * s for s in seq_lengths)
    if loss_tokens is None:
        return 6.0 * cfg.num_params() * tokens + attn
    if not 0 <= loss_tokens <= tokens:
        raise ValueError(f"loss_tokens {loss_tokens} not in [0, {tokens}]")
    head = cfg.vocab_size * cfg.hidden_size
    return 6.0 * (cfg.num_params() - head) * tokens + 6.0 * head * loss_tokens + attn


def decode_flops(cfg, contexts: Iterable[int]) -> float:
    """Returns the forward FLOPs of generating one token at each cached-context length in ``contexts``:
    Σ (2·N + 4·L·H·E·c)."""
    cs = [float(c) for c in contexts]
    return forward_flops(cfg, len(cs), sum(cs))


def forward_flops(cfg, tokens: float, context_sum: float) -> float:
    """Returns the forward FLOPs of ``tokens`` tokens whose attended positions total ``context_sum``:
    2·N·tokens + 4·L·H·E·context_sum (``decode_flops`` in closed form, for a prefill's many tokens)."""
    return 2.0 * cfg.num_params() * tokens + 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context_sum


def kv_bytes_per_token(cfg, itemsize: int) -> int:
    """Returns the bytes of K and V one cached token holds over all layers."""
    return cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * itemsize


def peak_memory_bytes(devices) -> int | None:
    """Returns the largest ``peak_bytes_in_use`` any of ``devices`` reports, or None where the backend reports no
    memory statistics (CPU)."""
    peaks = []
    for d in devices:
        try:
            stats = d.memory_stats() or {}
        except Exception:  # noqa: BLE001  (some backends raise instead of returning None)
            stats = {}
        if "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None

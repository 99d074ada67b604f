"""Qwen3 architecture configuration: presets, Hugging Face ``config.json`` in and out, validation.

``Qwen3Config`` holds the architecture (what the weights mean) and two numeric choices that are ours:
``dtype`` (the compute dtype of activations and matmuls) and ``param_dtype`` (the storage dtype of the master
weights; fp32 by default, because an AdamW step at lr 3e-6 on a weight of magnitude ~1e-2 is below bf16's
resolution and would vanish).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40_960
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"  # master-weight dtype
    remat: bool = False  # rematerialise each layer in the backward pass (activation memory ∝ 1 layer)
    logits_chunk: int = 1024  # tokens per device per step of the loss head (never a full [T, V] logits tensor)

    def __post_init__(self) -> None:
        errors = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings", "logits_chunk"):
            if int(getattr(self, name)) <= 0:
                errors.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads:
            errors.append(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}) "
                "for grouped-query attention")
        if self.head_dim % 2:
            errors.append(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                errors.append(f"{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            errors.append("rope_theta and rms_norm_eps must be positive")
        if errors:
            raise ValueError("invalid Qwen3Config: " + "; ".join(errors))

    # ----------------------------------------------------------------------------------------------------------
    @property
    def compute_dtype(self):
        """The jnp dtype activations and matmuls run in."""
        return _DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        """The jnp dtype parameters are stored in."""
        return _DTYPES[self.param_dtype]

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> "Qwen3Config":
        """Returns a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Returns the exact parameter count of this architecture (embedding counted once when tied)."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = d * q + 2 * d * kv + q * d + 3 * d * f + 2 * self.head_dim + 2 * d
        total = v * d + self.num_layers * per_layer + d
        return total if self.tie_word_embeddings else total + v * d

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "Qwen3Config":
        """Returns a named preset: ``qwen3-4b-instruct-2507`` (the paper's policy), ``tiny`` (CPU tests)."""
        if name not in PRESETS:
            raise ValueError(f"unknown Qwen3 preset {name!r}; known presets: {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    # ----------------------------------------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> "Qwen3Config":
        """Returns the config of a Hugging Face Qwen3 ``config.json`` dict.

        Reads both layouts of the rotary base: ``rope_theta`` at top level (published Qwen3 checkpoints) and
        ``rope_parameters.rope_theta`` (newer transformers). Raises ValueError, naming the field, for anything
        this model does not implement (another architecture, rope scaling, sliding windows, attention biases,
        an activation other than SiLU) rather than silently computing something else.
        """
        model_type = hf.get("model_type")
        if model_type != "qwen3":
            raise ValueError(f"unsupported model_type {model_type!r}: this model implements dense 'qwen3' only")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}: Qwen3's MLP is SwiGLU with 'silu'")
        if hf.get("attention_bias", False):
            raise ValueError("unsupported attention_bias=true: Qwen3 attention projections have no bias")
        if hf.get("use_sliding_window", False):
            raise ValueError("unsupported use_sliding_window=true: only full causal attention is implemented")
        rope_params = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {}
        rope_type = rope_params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in (None, "default"):
            raise ValueError(f"unsupported rope scaling {rope_type!r}: only the default rotary embedding is "
                             "implemented (remove rope_scaling for contexts within max_position_embeddings)")
        theta = hf.get("rope_theta", rope_params.get("rope_theta"))
        if theta is None:
            raise ValueError("config.json has neither rope_theta nor rope_parameters.rope_theta")
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        fields = dict(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or hidden // num_heads),
            rope_theta=float(theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 40_960)),
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_hf_json(cls, path: str | Path, **overrides: Any) -> "Qwen3Config":
        """Returns the config read from a ``config.json`` file (or a directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no Hugging Face config.json at {path}")
        return cls.from_hf_dict(json.loads(path.read_text()), **overrides)

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """Returns a ``config.json`` dict that transformers' ``Qwen3ForCausalLM`` loads."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_layers,
            "initializer_range": 0.02,
            "use_cache": True,
            "bos_token_id": None,
            "eos_token_id": None,
            "torch_dtype": torch_dtype,
        }


PRESETS: dict[str, Qwen3Config] = {
    # Qwen/Qwen3-4B-Instruct-2507: 4,022,468,096 parameters, tied embeddings.
    "qwen3-4b-instruct-2507": Qwen3Config(
        vocab_size=151_936, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        max_position_embeddings=262_144, dtype="bfloat16", param_dtype="float32", remat=True,
        logits_chunk=1024),
    # A CPU-sized model for tests: every mechanism of the real one (GQA 2:1, q/k norms, tied embeddings).
    "tiny": Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        max_position_embeddings=4096, logits_chunk=64),
    # The embedded CPU default's policy (configs/tiny_cpu.yaml): big enough to copy item names and amounts from
    # observations into code, small enough to train and sample on 2 CPU cores.
    "tiny-agent": Qwen3Config(
        vocab_size=1024, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        max_position_embeddings=4096, logits_chunk=128),
}

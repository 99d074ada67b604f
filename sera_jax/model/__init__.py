"""Qwen3 in Flax: config, pure forward, chunked token logprobs, Hugging Face weights, tokenizer."""

from sera_jax.model.config import PRESETS, Qwen3Config
from sera_jax.model.logprobs import chunked_logprobs, token_logprobs
from sera_jax.model.qwen3 import (
                                  abstract_params,
                                  default_positions,
                                  forward,
                                  hidden_states,
                                  init_params,
                                  param_logical_axes,
)
from sera_jax.model.sharding import param_shardings, shard_params
from sera_jax.model.weights import load_pretrained, save_pretrained

__all__ = ["PRESETS", "Qwen3Config", "abstract_params", "default_positions", "forward", "hidden_states",
           "init_params", "param_logical_axes", "chunked_logprobs", "token_logprobs", "param_shardings",
           "shard_params", "load_pretrained", "save_pretrained"]

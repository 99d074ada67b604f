"""GPU kernels (Pallas/Triton) with pure-JAX references as oracles; tested on CPU in Pallas interpret mode.

Status: tested for correctness only (interpret mode against the references, and lowering to Triton for CUDA);
not yet compiled or timed on a GPU. ``tools/gpu_kernels.sh`` checks and times them on an H200.

  paged_decode_attention   queries over a paged, ragged KV cache (returns out + lse)        paged_decode.py
  paged_attention          drop-in for sera_jax.sampling.attention.paged_attention          paged_attention.py
  flash_attention          packed causal training attention, segment ids, GQA, fwd + bwd    flash_attention.py
  select                   which implementation runs where (GPU -> kernels, else reference) select.py
  sharding                 shard_map of a kernel over the ambient mesh by logical axis rules sharding.py
"""

from sera_jax.kernels.flash_attention import Tiles, flash_attention, flash_attention_with_lse
from sera_jax.kernels.paged_decode import paged_decode_attention

__all__ = ["Tiles", "flash_attention", "flash_attention_with_lse", "paged_decode_attention"]

"""Hugging Face Qwen3 checkpoints (``config.json`` + ``*.safetensors``) ⇄ our parameter tree.

Loading places every tensor directly with its target sharding: ``jax.make_array_from_callback`` asks for each
device's shard, and the callback reads only that shard's rows/columns from the memory-mapped safetensors file
(``safe_open(...).get_slice``) and converts only them to the master dtype. A 4B checkpoint therefore never needs a
full fp32 copy on the host.

HF stores linear weights as [out, in]; we store [in, out] with heads split out (q_proj [D, H, E], o_proj [H, E, D]),
and stack the layers on a leading axis.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import Params, abstract_params
from sera_jax.model.sharding import param_shardings
from sera_jax.parallel.rules import TRAIN_RULES

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@dataclasses.dataclass(frozen=True)
class _Mapping:
    """How one of our leaves is stored in HF: the tensor name (per layer when ``{i}`` appears) and its layout.

    kind ``same``: identical layout. ``t_split``: HF [O, I] ↔ ours [I, *split(O)]. ``o_proj``: HF [D, H*E] ↔ ours
    [H, E, D].
    """

    path: tuple[str, ...]
    hf_name: str
    kind: str

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.hf_name


def _mappings(cfg: Qwen3Config) -> list[_Mapping]:
    layer = "model.layers.{i}."
    maps = [
        _Mapping(("embed", "embedding"), "model.embed_tokens.weight", "same"),
        _Mapping(("final_norm", "scale"), "model.norm.weight", "same"),
        _Mapping(("layers", "attn_norm", "scale"), layer + "input_layernorm.weight", "same"),
        _Mapping(("layers", "mlp_norm", "scale"), layer + "post_attention_layernorm.weight", "same"),
        _Mapping(("layers", "attn", "q_proj"), layer + "self_attn.q_proj.weight", "t_split"),
        _Mapping(("layers", "attn", "k_proj"), layer + "self_attn.k_proj.weight", "t_split"),
        _Mapping(("layers", "attn", "v_proj"), layer + "self_attn.v_proj.weight", "t_split"),
        _Mapping(("layers", "attn", "o_proj"), layer + "self_attn.o_proj.weight", "o_proj"),
        _Mapping(("layers", "attn", "q_norm", "scale"), layer + "self_attn.q_norm.weight", "same"),
        _Mapping(("layers", "attn", "k_norm", "scale"), layer + "self_attn.k_norm.weight", "same"),
        _Mapping(("layers", "mlp", "gate_proj"), layer + "mlp.gate_proj.weight", "t_split"),
        _Mapping(("layers", "mlp", "up_proj"), layer + "mlp.up_proj.weight", "t_split"),
        _Mapping(("layers", "mlp", "down_proj"), layer + "mlp.down_proj.weight", "t_split"),
    ]
    if not cfg.tie_word_embeddings:
        maps.append(_Mapping(("lm_head",), "lm_head.weight", "t_split"))
    return maps


def _hf_shape(kind: str, ours: tuple[int, ...]) -> tuple[int, ...]:
    if kind == "same":
        return ours
    if kind == "t_split":
        return (int(np.prod(ours[1:])), ours[0])
    return (ours[2], ours[0] * ours[1])  # o_proj


def _norm(s: slice, n: int) -> tuple[int, int]:
    start, stop, step = s.indices(n)
    if step != 1:
        raise ValueError("strided shard indices are not supported")
    return start, stop


def _read_block(get: Callable[[tuple[slice, ...]], np.ndarray], kind: str, ours_shape: tuple[int, ...],
                index: tuple[slice, ...]) -> np.ndarray:
    """Returns ours[index] for one layer's tensor, reading only the needed HF rows/columns."""
    if kind == "same":
        return get(index)
    if kind == "t_split":
        i0, i1 = _norm(index[0], ours_shape[0])
        out_shape = ours_shape[1:]
        lead0, lead1 = _norm(index[1], out_shape[0])
        inner = int(np.prod(out_shape[1:]))
        block = get((slice(lead0 * inner, lead1 * inner), slice(i0, i1)))  # [o_sub, i_sub]
        block = block.T.reshape((i1 - i0, lead1 - lead0) + tuple(out_shape[1:]))
        return block[(slice(None), slice(None)) + tuple(index[2:])]
    # o_proj: ours [H, E, D] from HF [D, H*E]
    h, e, d = ours_shape
    h0, h1 = _norm(index[0], h)
    d0, d1 = _norm(index[2], d)
    block = get((slice(d0, d1), slice(h0 * e, h1 * e)))  # [d_sub, h_sub*E]
    block = block.T.reshape(h1 - h0, e, d1 - d0)
    return block[:, index[1], :]


class _Checkpoint:
    """Memory-mapped safetensors files of one HF directory, looked up by tensor name."""

    def __init__(self, hf_dir: Path):
        index = hf_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
            weight_map = None
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {hf_dir}")
        self.handles = {}
        self.where: dict[str, str] = {}
        for name in files:
            path = hf_dir / name
            if not path.is_file():
                raise FileNotFoundError(f"{path} is listed in the safetensors index but missing")
            handle = safe_open(str(path), framework="numpy")
            self.handles[name] = handle
            for key in handle.keys():
                self.where[key] = name
        if weight_map is not None:
            missing = sorted(k for k in weight_map if k not in self.where)
            if missing:
                raise ValueError(f"tensors named in the index but absent from their files: {missing[:5]}")

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.handles[self.where[name]].get_slice(name).get_shape())

    def getter(self, name: str):
        sl = self.handles[self.where[name]].get_slice(name)
        return lambda idx: np.asarray(sl[idx])


def load_pretrained(hf_dir: str | Path, *, mesh: Mesh | None = None, rules=None, param_dtype: str | None = None,
                    dtype: str | None = None) -> tuple[Qwen3Config, Params]:
    """Returns (cfg, params) read from a Hugging Face Qwen3 directory (``config.json`` + safetensors).

    With ``mesh`` (and ``rules``, default the training rules) every parameter is created directly with its
    target sharding; without, on the default device. ``param_dtype`` (default fp32) is the storage dtype,
    ``dtype`` the compute dtype. Raises a clear error for a missing, mismatched or unexpected tensor.
    """
    hf_dir = Path(hf_dir)
    overrides = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype)) if v is not None}
    cfg = Qwen3Config.from_hf_json(hf_dir, **overrides)
    ckpt = _Checkpoint(hf_dir)
    target = abstract_params(cfg)
    if mesh is not None:
        shardings = param_shardings(cfg, mesh, rules or TRAIN_RULES)
    else:
        device = SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: device, target)

    maps = _mappings(cfg)
    expected_names = set()
    for m in maps:
        names = [m.hf_name.format(i=i) for i in range(cfg.num_layers)] if m.per_layer else [m.hf_name]
        expected_names.update(names)
    missing = sorted(n for n in expected_names if n not in ckpt.where)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint {hf_dir} lacks tensors {missing[:5]}{more}")
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    unexpected = sorted(n for n in ckpt.where if n not in expected_names and n not in ignorable
                        and not n.endswith("rotary_emb.inv_freq"))
    if unexpected:
        raise ValueError(f"checkpoint {hf_dir} has tensors this Qwen3 model does not use: {unexpected[:5]}")

    np_dtype = _NP_DTYPES[cfg.param_dtype]
    params: Params = {}
    for m in maps:
        leaf = target
        for key in m.path:
            leaf = leaf[key]
        sharding = shardings
        for key in m.path:
            sharding = sharding[key]
        full_shape = tuple(leaf.shape)
        one_shape = full_shape[1:] if m.per_layer else full_shape
        names = [m.hf_name.format(i=i) for i in range(cfg.num_layers)] if m.per_layer else [m.hf_name]
        want = _hf_shape(m.kind, one_shape)
        for n in names:
            if ckpt.shape(n) != want:
                raise ValueError(f"tensor {n} has shape {ckpt.shape(n)}, but config.json implies {want}")
        getters = [ckpt.getter(n) for n in names]

        def callback(index, m=m, getters=getters, one_shape=one_shape, full_shape=full_shape):
            index = tuple(index) + (slice(None),) * (len(full_shape) - len(index))
            if not m.per_layer:
                return _read_block(getters[0], m.kind, one_shape, index).astype(np_dtype)
            l0, l1 = _norm(index[0], full_shape[0])
            blocks = [_read_block(getters[i], m.kind, one_shape, index[1:]).astype(np_dtype) for i in range(l0, l1)]
            return np.stack(blocks)

        array = jax.make_array_from_callback(full_shape, sharding, callback)
        node = params
        for key in m.path[:-1]:
            node = node.setdefault(key, {})
        node[m.path[-1]] = array
    return cfg, params


def _to_host(x) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _from_ours(kind: str, ours: np.ndarray) -> np.ndarray:
    if kind == "same":
        return ours
    if kind == "t_split":
        return ours.reshape(ours.shape[0], -1).T
    h, e, d = ours.shape
    return ours.reshape(h * e, d).T


def save_pretrained(cfg: Qwen3Config, params: Params, hf_dir: str | Path, *, dtype: str = "float32",
                    max_shard_bytes: int = 5 * 2**30) -> list[Path]:
    """Writes ``config.json`` and safetensors (sharded with an index above ``max_shard_bytes``) that
    transformers' ``Qwen3ForCausalLM`` loads; returns the written weight files. Only process 0 writes."""
    if dtype not in _NP_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_NP_DTYPES)}, got {dtype!r}")
    hf_dir = Path(hf_dir)
    np_dtype = _NP_DTYPES[dtype]
    tensors: dict[str, np.ndarray] = {}
    for m in _mappings(cfg):
        leaf = params
        for key in m.path:
            if key not in leaf:
                raise ValueError(f"params lack {'/'.join(m.path)}")
            leaf = leaf[key]
        host = _to_host(leaf)
        if m.per_layer:
            for i in range(cfg.num_layers):
                tensors[m.hf_name.format(i=i)] = np.ascontiguousarray(_from_ours(m.kind, host[i]).astype(np_dtype))
        else:
            tensors[m.hf_name] = np.ascontiguousarray(_from_ours(m.kind, host).astype(np_dtype))
    if jax.process_index() != 0:
        return []
    hf_dir.mkdir(parents=True, exist_ok=True)
    (hf_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict(torch_dtype=dtype), indent=2) + "\n")
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, t in tensors.items():
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    written = []
    if len(shards) == 1:
        path = hf_dir / "model.safetensors"
        save_file(shards[0], str(path), metadata={"format": "pt"})
        written.append(path)
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(hf_dir / name), metadata={"format": "pt"})
            weight_map.update({t: name for t in shard})
            written.append(hf_dir / name)
        total = sum(t.nbytes for t in tensors.values())
        (hf_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return written

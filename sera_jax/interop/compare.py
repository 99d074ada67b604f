"""``sera-compare``: our numbers against PyTorch/transformers on the same weights, in fp32.

For a run checkpoint, a Hugging Face directory or the tiny default (random ``tiny`` preset), the parameters are cast
to fp32 and written with ``save_pretrained`` into a temporary directory that transformers' ``Qwen3ForCausalLM``
loads (eager attention, fp32). Then, on random token rows:

The tiny default's final norm is scaled by ``TINY_FINAL_NORM`` so its next-token distributions are broad.

* ``logits``: ``model.forward`` vs the torch model's logits;
* ``token_logprobs``: the trainer's chunked ``token_logprobs`` vs torch ``log_softmax`` gathered at the targets;
* ``engine_logprobs``: the rollout engine's returned logprobs of its own greedy tokens vs torch's logprobs of those
  tokens given the same prefix; ``engine_greedy``: how many greedy tokens differ from torch's argmax where torch's
  top-2 gap is clear (> 1e-3) — must be 0;
* ``cispo_loss`` and ``grad_norm``: ``rl.losses.cispo_loss`` on our logprobs and its gradient norm vs a CISPO
  written in torch (clipped ratio detached, ratio in [0, 5], token mean over the loss mask) with autograd;
  ``grad_max_rel``: the largest per-tensor relative L2 error of the gradients (under Hugging Face names).

Each error is ``max |ours − torch|`` divided by ``max(1, max |torch|)`` (a relative error for large values, an
absolute one for small); it passes at ≤ ``tol`` (1e-4, fp32; JAX matmuls at "highest" precision so GPUs do not
use TF32). torch and transformers are imported only here.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sera_jax.model import (
    Qwen3Config,
    abstract_params,
    forward,
    init_params,
    load_pretrained,
    save_pretrained,
    token_logprobs,
)
from sera_jax.parallel.mesh import MeshConfig, make_mesh
from sera_jax.rl.losses import cispo_loss
from sera_jax.sampling import Engine, EngineConfig
from sera_jax.sampling.types import SamplingParams
from sera_jax.training.checkpoint import Checkpointer, checkpoint_dir

TINY_FINAL_NORM = 0.4

__all__ = ["MissingTorch", "load_fp32_params", "compare", "format_table", "result_line"]


class MissingTorch(ImportError):
    """torch or transformers is not installed."""


def _torch():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise MissingTorch(f"sera-compare needs torch and transformers ({e}); install them with "
                           "`pip install torch transformers` (the project's test extras)") from e
    return torch, transformers


def load_fp32_params(*, checkpoint: str | Path | None = None, hf_dir: str | Path | None = None,
                     seed: int = 0, version: int | None = None) -> tuple[Any, Any, str]:
    """Returns (fp32 Qwen3Config, fp32 params, a description of the source): a run checkpoint, a HF directory or
    the random tiny preset seeded with ``seed``."""
    import jax

    fp32 = dict(dtype="float32", param_dtype="float32")
    if checkpoint is not None:
        d = checkpoint_dir(checkpoint)
        ck = Checkpointer(d)
        try:
            meta = ck.read_meta(version)
            cfg = Qwen3Config(**meta["model_config"])
            params, meta = ck.restore_params(abstract_params(cfg), version)
        finally:
            ck.close()
        cfg = cfg.replace(**fp32)
        params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
        return cfg, params, f"checkpoint {d} version {meta.get('version')}"
    if hf_dir is not None:
        cfg, params = load_pretrained(hf_dir, **fp32)
        return cfg, params, f"hf {hf_dir}"
    cfg = Qwen3Config.preset("tiny", **fp32)
    params = init_params(jax.random.key(seed), cfg)
    # Untempered, greedy decoding of a random tiny model repeats one token at logprob ~0, which would make the engine
    # comparison vacuous. A smaller final norm tempers the logits so greedy logprobs are far from 0.
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * TINY_FINAL_NORM
    return cfg, params, f"tiny preset, random init seed {seed}, final norm x{TINY_FINAL_NORM}"


def _err(ours, ref) -> tuple[float, float]:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref))), float(np.max(np.abs(ref)))


def _engine_greedy(cfg, params, prompts: np.ndarray, new_tokens: int):
    """Returns [(token ids, logprobs)] of greedy completions of each prompt row from the rollout engine."""
    import jax

    b, t = prompts.shape
    width = -(-(t + new_tokens) // 16)
    ec = EngineConfig(max_batch=b, batch_buckets=(b,), block_size=16, num_blocks=1 + 2 * b * width,
                      max_context=t + new_tokens, chunk_steps=8, max_prefill_len=t, max_prefill_batch=b,
                      prefill_batch_buckets=(b,), prefill_len_buckets=(t,), max_prefill_tokens=b * t,
                      width_buckets=(width,), dtype="float32")
    engine = Engine(cfg, params, ec, mesh=make_mesh(MeshConfig(1, 1, 1), jax.local_devices()[:1]))

    async def run():
        sp = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
        return await asyncio.gather(*(engine.generate([int(x) for x in row], sp) for row in prompts))

    try:
        results = asyncio.run(run())
    finally:
        engine.close()
    return [(list(r.token_ids), list(r.logprobs)) for r in results]


def compare(*, checkpoint: str | Path | None = None, hf_dir: str | Path | None = None, seed: int = 0,
            batch: int = 2, seq_len: int = 48, new_tokens: int = 12, tol: float = 1e-4,
            version: int | None = None) -> dict[str, Any]:
    """Runs every comparison of the module docstring; returns {"source", "tol", "rows": [{name, max_err, scale,
    err, tol, ok}], "ok"} (err = max_err / max(1, scale))."""
    _torch()  # fail early, before loading a large model, when torch/transformers are missing
    import jax

    cfg, params, source = load_fp32_params(checkpoint=checkpoint, hf_dir=hf_dir, seed=seed, version=version)
    # True fp32 matmuls (GPUs would otherwise use TF32 for fp32 inputs, ~1e-3 relative error); set globally, not
    # in a thread-local context, because the engine computes in its own driver thread. torch runs on CPU.
    previous = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        return _compare(cfg, params, source, tol=tol, seed=seed, batch=batch, seq_len=seq_len, new_tokens=new_tokens)
    finally:
        jax.config.update("jax_default_matmul_precision", previous)


def _compare(cfg, params, source: str, *, tol: float, seed: int, batch: int, seq_len: int, new_tokens: int):
    torch, transformers = _torch()
    import jax
    import jax.numpy as jnp
    from safetensors.numpy import load_file

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, size=(batch, seq_len), dtype=np.int32)
    rows: list[dict[str, Any]] = []

    def row(name: str, max_err: float, scale: float, limit: float = tol) -> None:
        err = max_err / max(1.0, scale)
        rows.append({"name": name, "max_err": max_err, "scale": scale, "err": err, "tol": limit,
                     "ok": bool(np.isfinite(err) and err <= limit)})

    with tempfile.TemporaryDirectory(prefix="sera-compare-") as tmp:
        save_pretrained(cfg, params, Path(tmp) / "model", dtype="float32")
        torch.manual_seed(seed)
        model = transformers.Qwen3ForCausalLM.from_pretrained(
            Path(tmp) / "model", dtype=torch.float32, attn_implementation="eager").eval()

        # Logits and the trainer's token logprobs.
        ids_t = torch.as_tensor(tokens, dtype=torch.long)
        with torch.no_grad():
            logits_t = model(input_ids=ids_t).logits.float()
        logits_j = jax.jit(lambda p, x: forward(p, cfg, x))(params, tokens)
        row("logits", *_err(logits_j, logits_t.numpy()))
        lp_t = torch.log_softmax(logits_t[:, :-1], -1).gather(-1, ids_t[:, 1:, None])[..., 0].numpy()
        lp_fn = jax.jit(lambda p, x, y: token_logprobs(p, cfg, x, y))
        lp_j = lp_fn(params, tokens[:, :-1], tokens[:, 1:])
        row("token_logprobs", *_err(lp_j, lp_t))

        # The engine's greedy tokens and returned logprobs against torch on the same sequences.
        prompt_len = seq_len // 2
        outs = _engine_greedy(cfg, params, tokens[:, :prompt_len], new_tokens)
        eng_err, eng_scale, mismatches = 0.0, 0.0, 0
        for b, (gen, lps) in enumerate(outs):
            seq = torch.as_tensor([list(tokens[b, :prompt_len]) + gen], dtype=torch.long)
            with torch.no_grad():
                lg = model(input_ids=seq).logits.float()[0, prompt_len - 1:-1]
            ref = torch.log_softmax(lg, -1).gather(-1, seq[0, prompt_len:, None])[:, 0].numpy()
            e, s = _err(lps, ref)
            eng_err, eng_scale = max(eng_err, e), max(eng_scale, s)
            top2 = torch.topk(lg, 2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]).numpy() > 1e-3
            mismatches += int(np.sum(clear & (lg.argmax(-1).numpy() != np.asarray(gen))))
        row("engine_logprobs", eng_err, eng_scale)
        row("engine_greedy_mismatches", float(mismatches), 0.0, 0.0)

        # CISPO loss and its gradient: behaviour logprobs spread around the current ones (ratios on both sides
        # of 1 and past the clip at 5), random advantages per row, the prompt half masked out.
        old = np.asarray(lp_t, np.float64) + rng.normal(0.0, 1.0, lp_t.shape)
        old[:, ::4] -= 3.0
        old = old.astype(np.float32)
        adv = np.repeat(rng.normal(0.0, 1.0, (batch, 1)), seq_len - 1, axis=1).astype(np.float32)
        mask = np.zeros((batch, seq_len - 1), np.float32)
        mask[:, prompt_len - 1:] = 1.0

        def loss_fn(p):
            return cispo_loss(token_logprobs(p, cfg, tokens[:, :-1], tokens[:, 1:]), old, adv, mask,
                              ratio_min=0.0, ratio_max=5.0)

        loss_j, grads_j = jax.jit(jax.value_and_grad(loss_fn))(params)
        gnorm_j = float(jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads_j))))
        model.zero_grad()
        logp = torch.log_softmax(model(input_ids=ids_t[:, :-1]).logits.float(), -1).gather(
            -1, ids_t[:, 1:, None])[..., 0]
        m, o, a = (torch.as_tensor(x) for x in (mask, old, adv))
        coef = torch.exp(logp - o).clamp(0.0, 5.0).detach()
        loss_t = (-coef * a * logp * m).sum() / m.sum().clamp(min=1.0)
        loss_t.backward()
        grads_t = {n: p.grad.detach().numpy() for n, p in model.named_parameters() if p.grad is not None}
        gnorm_t = float(np.sqrt(sum(np.sum(np.square(g.astype(np.float64))) for g in grads_t.values())))
        row("cispo_loss", *_err(float(loss_j), float(loss_t.detach())))
        row("grad_norm", *_err(gnorm_j, gnorm_t))
        save_pretrained(cfg, grads_j, Path(tmp) / "grads", dtype="float32")
        gj = load_file(str(Path(tmp) / "grads" / "model.safetensors"))
        worst = 0.0
        for name, want in grads_t.items():
            got = gj.get(name)
            if got is None:
                worst = float("inf")
                continue
            worst = max(worst, float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)))
        row("grad_max_rel", worst, 0.0)
    return {"source": source, "tol": tol, "rows": rows, "ok": all(r["ok"] for r in rows),
            "clipped_tokens": int(np.sum((np.exp(lp_t - old) > 5.0) & (mask > 0)))}


def format_table(result: dict[str, Any]) -> str:
    """Returns the Markdown table of a ``compare`` result."""
    lines = [f"sera-compare: {result['source']} (fp32, JAX vs PyTorch/transformers)", "",
             "| quantity | max abs error | max abs reference | error | tolerance | pass |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['max_err']:.3e} | {r['scale']:.3e} | {r['err']:.3e} | {r['tol']:.0e} | "
                     f"{'PASS' if r['ok'] else 'FAIL'} |")
    return "\n".join(lines)


def result_line(result: dict[str, Any]) -> str:
    """Returns the ``RESULT key=value ...`` line of a ``compare`` result."""
    parts = [f"pass={int(result['ok'])}"] + [f"{r['name']}={r['err']:.3e}" for r in result["rows"]]
    return "RESULT " + " ".join(parts)

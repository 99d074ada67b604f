"""CISPO loss and gradients through the tiny Qwen3 equal a PyTorch computation on transformers' Qwen3 (fp32).

JAX side: the real path — datums packed into micro-batches with segment ids, chunked token logprobs, the registered
loss normalised by the step's global token count. PyTorch side: each datum alone through ``Qwen3ForCausalLM``, the
same loss written out by hand (clipped ratio detached), one backward. Gradients are compared tensor by tensor under
Hugging Face names (our gradient pytree is written with ``save_pretrained``, which maps it exactly like weights).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import torch
from safetensors.numpy import load_file

from rl_builders import random_datums
from sera_jax.model import save_pretrained, token_logprobs
from sera_jax.rl.batch import pack_datums
from sera_jax.rl.losses import loss_on_batch

RATIO_MAX = 5.0


def _with_behaviour_logprobs(ds, cfg, params, rng):
    """Behaviour logprobs = current logprobs + noise, so ratios spread on both sides of 1 and past the clip."""
    width = max(len(d.tokens) for d in ds)
    rows = np.zeros((len(ds), width), np.int32)
    for i, d in enumerate(ds):
        rows[i, :len(d.tokens)] = d.tokens
    lp = jax.jit(lambda p, t, y: token_logprobs(p, cfg, t, y))
    cur = np.asarray(lp(params, rows[:, :-1], rows[:, 1:]), np.float64)
    out = []
    for i, d in enumerate(ds):
        n = len(d.tokens) - 1
        noise = rng.normal(0.0, 1.0, n)
        noise[::4] -= 3.0  # ratio ≥ e^3·(…) on these: well past the clip at 5
        old = cur[i, :n] + noise
        out.append(dataclasses.replace(d, logprobs=(0.0,) + tuple(float(x) for x in old)))
    return out


def _torch_loss(model, ds, num_tokens):
    total = 0.0
    clipped = 0
    for d in ds:
        ids = torch.tensor(d.tokens, dtype=torch.long)
        logits = model(input_ids=ids[None, :-1]).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[1:, None])[:, 0]
        old = torch.tensor(d.logprobs[1:], dtype=torch.float32)
        mask = torch.tensor(d.mask[1:], dtype=torch.float32)
        coef = torch.exp(logp - old).clamp(0.0, RATIO_MAX).detach()
        clipped += int(((torch.exp(logp - old) > RATIO_MAX) & (mask > 0)).sum())
        total = total + (-coef * d.advantage * logp * mask).sum()
    return total / num_tokens, clipped


def test_cispo_loss_and_gradients_match_transformers(tiny_qwen, tmp_path):
    cfg, params, model = tiny_qwen
    rng = np.random.default_rng(5)
    ds = random_datums(rng, 10, max_len=48)
    ds = [dataclasses.replace(d, tokens=tuple(t % cfg.vocab_size for t in d.tokens)) for d in ds]
    ds = _with_behaviour_logprobs(ds, cfg, params, rng)
    step = pack_datums(ds, token_budget=128, buckets=(64,))
    assert len(step.micro_batches) >= 2

    def micro_loss(p, mb):
        lp = token_logprobs(p, cfg, mb.tokens, mb.targets, mb.segment_ids, mb.positions)
        return loss_on_batch(lp, mb, "cispo", ratio_max=RATIO_MAX)

    # Accumulate over micro-batches as a trainer does: one compiled step, summed (the global N makes it exact).
    vg = jax.jit(jax.value_and_grad(micro_loss))
    parts = [vg(params, mb) for mb in step.micro_batches]
    loss_j = sum(float(l) for l, _ in parts)
    grads_j = jax.tree.map(lambda *g: sum(g), *[g for _, g in parts])

    model.zero_grad()
    loss_t, clipped = _torch_loss(model, ds, step.num_tokens)
    loss_t.backward()
    assert clipped > 0  # the clip is exercised

    lt = float(loss_t.detach())
    assert abs(loss_j - lt) <= 1e-4 * abs(lt)
    save_pretrained(cfg, grads_j, tmp_path / "grads")
    gj = load_file(str(tmp_path / "grads" / "model.safetensors"))
    gt = {name: p.grad.detach().numpy() for name, p in model.named_parameters()}
    assert set(gj) == set(gt)
    for name, want in gt.items():
        got = gj[name]
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err <= 1e-4, (name, err)
        assert np.abs(want).max() > 1e-6  # a real gradient, not two zeros

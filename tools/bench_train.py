"""Train-step throughput on CPU: our jitted ``train_step`` against the same step in PyTorch, side by side.

Both sides get the same weights (ours written with ``save_pretrained`` and loaded by transformers'
``Qwen3ForCausalLM``), the same packed micro-batches (rows of several sequences: block-diagonal causal attention,
positions restarting per sequence), the same CISPO loss (−clip(exp(logp − old), 0, 5)·A·logp summed over loss tokens
/ N, the coefficient detached), gradient accumulation over the micro-batches, global-norm clip 1.0 and AdamW with
the same hyper-parameters (torch.optim.AdamW vs the optax chain). Both run in fp32 on the pinned cores, without
gradient checkpointing. Steps alternate between the two frameworks so a noisy machine slows both alike.

One difference is the point of our trainer, not of the benchmark: the PyTorch side takes ``model(...).logits`` at
every position, as a transformers training step does, while ours computes the output head only for chunks that
hold loss tokens (``chunked_logprobs`` with the loss mask; here ~half the tokens are prompt).

Checks: the step-0 losses and gradient norms agree (the sides compute the same function). Prints a table and one
line ``RESULT key=value ...``; ``--quick`` runs a smaller model for a few steps.

    python tools/bench_train.py [--quick] [--steps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _pin_threads(argv: list[str]) -> int:
    """Pins this process to ``--threads`` cores (default 1) before JAX or torch start their thread pools; returns
    the count. On a shared machine an oversubscribed intra-op pool spin-waits (torch with 2 threads on 2 busy cores
    ran 5-10x slower than with 1), so both frameworks get the same, pinned cores."""
    n = 1
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--threads="):
            n = int(a.split("=", 1)[1])
    cores = sorted(os.sched_getaffinity(0))
    n = max(1, min(n, len(cores)))
    os.sched_setaffinity(0, cores[:n])
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    return n


THREADS = _pin_threads(sys.argv[1:]) if __name__ == "__main__" else 0
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from sera_jax.model import Qwen3Config, init_params, save_pretrained  # noqa: E402
from sera_jax.rl.batch import pack_datums  # noqa: E402
from sera_jax.rl.datums import Datum  # noqa: E402
from sera_jax.rl.losses import StepConfig  # noqa: E402
from sera_jax.rl.optim import OptimConfig, make_optimizer  # noqa: E402
from sera_jax.training.step import init_train_state, make_train_step, stack_micro_batches  # noqa: E402

# "Small but not trivial": matmuls of a few hundred wide dominate, not per-op dispatch.
FULL = dict(model=dict(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_layers=4, num_heads=6,
                       num_kv_heads=2, head_dim=64), row_len=512, rows=4, micro=2, steps=3)
QUICK = dict(model=dict(vocab_size=2048, hidden_size=192, intermediate_size=512, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=48), row_len=256, rows=2, micro=2, steps=2)
OPTIM = OptimConfig(lr=1e-4, warmup_steps=0)  # no warm-up: torch's AdamW has none, and step 0 must move weights
RATIO_MAX = 5.0


def make_datums(cfg: Qwen3Config, tokens: int, row_len: int, seed: int = 0) -> list[Datum]:
    """Returns random datums of ≥ ``tokens`` tokens in all: lengths 60..row_len, prompts untrained (behaviour
    logprobs are placeholders: ``with_behaviour_logprobs`` sets them from the model)."""
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < tokens:
        n = int(rng.integers(60, row_len + 1))
        prompt = int(rng.integers(n // 4, 3 * n // 4))
        logp = np.concatenate([[0.0], -np.log(cfg.vocab_size) + rng.normal(0, 0.8, n - 1)])
        out.append(Datum(tokens=tuple(int(t) for t in rng.integers(0, cfg.vocab_size, n)),
                         mask=(0,) * prompt + (1,) * (n - prompt), logprobs=tuple(float(x) for x in logp),
                         versions=(0,) * n, reward=0.0, advantage=float(rng.normal()), objective="execution",
                         traj_depth=0, traj_start=1))
        total += n
    return out


def with_behaviour_logprobs(batch, params, cfg: Qwen3Config, seed: int = 1):
    """Returns ``batch`` with behaviour logprobs = the model's own + N(0, 0.5²), every 7th token −2.5 more, so the
    CISPO ratios fall on both sides of 1 and some exceed the clip at 5."""
    from sera_jax.model import token_logprobs

    lp = jax.jit(lambda t, y, s, p: token_logprobs(params, cfg, t, y, s, p))
    cur = np.stack([np.asarray(lp(batch.tokens[m], batch.targets[m], batch.segment_ids[m], batch.positions[m]))
                    for m in range(batch.tokens.shape[0])])
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, 0.5, cur.shape)
    noise.reshape(-1)[::7] -= 2.5
    mask = np.asarray(batch.loss_mask) > 0
    return batch.replace(old_logprobs=jax.numpy.asarray(np.where(mask, cur + noise, 0.0), jax.numpy.float32))


# ---------------------------------------------------------------------------------------------------------------
# PyTorch side

class TorchStep:
    """transformers Qwen3 + the CISPO loss + clip + AdamW, over the same stacked micro-batches."""

    def __init__(self, hf_dir: Path, optim: OptimConfig, remat: bool = False):
        import torch
        import transformers

        self.torch = torch
        self.model = transformers.Qwen3ForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, attn_implementation="sdpa")
        if remat:  # gradient checkpointing per decoder layer, as our cfg.remat
            enable = getattr(self.model, "activation_checkpointing_enable", None)  # transformers ≥ 5 name
            if enable is not None:
                enable({"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=optim.lr, betas=(optim.b1, optim.b2),
                                     eps=optim.eps, weight_decay=optim.weight_decay)
        self.clip = optim.clip_norm

    def inputs(self, batch) -> list[dict]:
        """Returns per micro-batch torch tensors: ids, positions, a 4D block-causal mask, targets, loss terms."""
        torch = self.torch
        out = []
        for m in range(batch.tokens.shape[0]):
            seg = torch.as_tensor(np.asarray(batch.segment_ids[m]))
            t = seg.shape[1]
            causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
            # The model's own rule: same segment and causal (padding attends to padding, so no row is empty).
            mask = (seg[:, :, None] == seg[:, None, :]) & causal[None]
            out.append(dict(
                ids=torch.as_tensor(np.asarray(batch.tokens[m]), dtype=torch.long),
                pos=torch.as_tensor(np.asarray(batch.positions[m]), dtype=torch.long),
                mask=mask[:, None],
                targets=torch.as_tensor(np.asarray(batch.targets[m]), dtype=torch.long),
                loss_mask=torch.as_tensor(np.asarray(batch.loss_mask[m])) > 0,
                adv=torch.as_tensor(np.asarray(batch.advantages[m]), dtype=torch.float32),
                old=torch.as_tensor(np.asarray(batch.old_logprobs[m]), dtype=torch.float32),
                n=float(np.asarray(batch.num_tokens[m]))))
        return out

    def step(self, micro: list[dict]) -> dict[str, float]:
        """Returns the loss and pre-clip gradient norm of one optimizer step (accumulating over ``micro``)."""
        torch = self.torch
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in micro:
            if not bool(mb["loss_mask"].any()):
                continue
            logits = self.model(input_ids=mb["ids"], position_ids=mb["pos"], attention_mask=mb["mask"]).logits
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, mb["targets"][..., None])[..., 0]
            delta = torch.where(mb["loss_mask"], logp - mb["old"], torch.zeros_like(logp))
            coef = torch.exp(delta).clamp(0.0, RATIO_MAX).detach()
            loss = torch.where(mb["loss_mask"], -coef * mb["adv"] * logp, torch.zeros_like(logp)).sum() / mb["n"]
            loss.backward()
            total += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        return {"loss": total, "grad_norm": float(norm)}


# ---------------------------------------------------------------------------------------------------------------

def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller model and fewer steps")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per framework (after one warm-up)")
    ap.add_argument("--remat", action="store_true",
                    help="both sides recompute each layer in the backward pass (the paper's gradient checkpointing)")
    ap.add_argument("--threads", type=int, default=1, help="cores both frameworks are pinned to (default 1)")
    args = ap.parse_args(argv)
    spec = QUICK if args.quick else FULL
    steps = args.steps or spec["steps"]

    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    cfg = Qwen3Config(**spec["model"], rope_theta=1_000_000.0, max_position_embeddings=4096,
                      logits_chunk=256, remat=args.remat)  # head: 256 tokens a step (4 rows x 64); 512 the same, 1024 8% slower
    step_tokens = spec["row_len"] * spec["rows"] * spec["micro"]
    datums = make_datums(cfg, int(step_tokens * 0.9), spec["row_len"])
    packed = pack_datums(datums, token_budget=spec["row_len"] * spec["rows"], row_len=spec["row_len"])
    batch = stack_micro_batches(packed.micro_batches, num=max(spec["micro"], len(packed.micro_batches)))
    real_tokens = int(np.sum(np.asarray(batch.segment_ids) > 0))
    loss_tokens = int(packed.num_tokens)

    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
    batch = with_behaviour_logprobs(batch, params, cfg)
    tx = make_optimizer(OPTIM)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(cfg, params, tmp)
        ref = TorchStep(Path(tmp), OPTIM, remat=args.remat)
    micro_t = ref.inputs(batch)

    jax_step = make_train_step(cfg, tx, StepConfig(ratio_max=RATIO_MAX))
    state = init_train_state(params, tx)
    (state, m0), jax_compile_s = _timed(lambda: jax.block_until_ready(jax_step(state, batch)))
    t0, torch_first_s = _timed(lambda: ref.step(micro_t))
    jax_s, torch_s, jax_m, torch_m = [], [], [dict(m0)], [t0]
    for _ in range(steps):  # alternate, so load from other processes hits both sides alike
        (state, m), dt = _timed(lambda: jax.block_until_ready(jax_step(state, batch)))
        jax_s.append(dt)
        jax_m.append(m)
        out, dt = _timed(lambda: ref.step(micro_t))
        torch_s.append(dt)
        torch_m.append(out)

    loss_j, loss_t = float(jax_m[0]["loss"]), torch_m[0]["loss"]
    gn_j, gn_t = float(jax_m[0]["grad_norm"]), torch_m[0]["grad_norm"]
    loss_rel = abs(loss_j - loss_t) / max(abs(loss_t), 1e-12)
    gn_rel = abs(gn_j - gn_t) / max(abs(gn_t), 1e-12)
    loss1_rel = abs(float(jax_m[1]["loss"]) - torch_m[1]["loss"]) / max(abs(torch_m[1]["loss"]), 1e-12)
    agree = loss_rel < 1e-4 and gn_rel < 1e-3
    jax_med, torch_med = statistics.median(jax_s), statistics.median(torch_s)
    speedup = torch_med / jax_med

    n_params = cfg.num_params()
    print(f"config: {'quick' if args.quick else 'full'} Qwen3 vocab={cfg.vocab_size} d={cfg.hidden_size} "
          f"ffn={cfg.intermediate_size} layers={cfg.num_layers} heads={cfg.num_heads}/{cfg.num_kv_heads}x"
          f"{cfg.head_dim} params={n_params / 1e6:.2f}M fp32 remat={cfg.remat}; "
          f"step = {batch.tokens.shape[0]} micro-batches x "
          f"{batch.tokens.shape[1]} rows x {batch.tokens.shape[2]} tokens ({real_tokens} real tokens, "
          f"{loss_tokens} loss tokens, {len(datums)} packed sequences); CISPO clip [0, {RATIO_MAX}], "
          f"clip-norm {OPTIM.clip_norm}, AdamW lr {OPTIM.lr} wd {OPTIM.weight_decay} betas ({OPTIM.b1}, {OPTIM.b2})")
    print(f"threads: both pinned to {len(os.sched_getaffinity(0))} of {os.cpu_count()} cores (torch threads="
          f"{torch.get_num_threads()}, XLA CPU devices={jax.device_count()}); timed steps={steps} each, alternating")
    print()
    print(f"{'':28s}{'JAX (ours)':>14s}{'PyTorch':>14s}")
    print(f"{'first step (s)':28s}{jax_compile_s:14.2f}{torch_first_s:14.2f}   (JAX: includes compilation)")
    print(f"{'step time, median (s)':28s}{jax_med:14.3f}{torch_med:14.3f}")
    print(f"{'step time, min (s)':28s}{min(jax_s):14.3f}{min(torch_s):14.3f}")
    print(f"{'tokens/s (real tokens)':28s}{real_tokens / jax_med:14.0f}{real_tokens / torch_med:14.0f}")
    print(f"{'step-0 loss':28s}{loss_j:14.6f}{loss_t:14.6f}   rel diff {loss_rel:.1e}")
    print(f"{'step-0 grad norm':28s}{gn_j:14.6f}{gn_t:14.6f}   rel diff {gn_rel:.1e}")
    print(f"{'step-1 loss (after AdamW)':28s}{float(jax_m[1]['loss']):14.6f}{torch_m[1]['loss']:14.6f}   "
          f"rel diff {loss1_rel:.1e}")
    print(f"speed-up (PyTorch time / JAX time): {speedup:.2f}x   (target >= 1.5x)")
    result = {"mode": "quick" if args.quick else "full", "remat": int(cfg.remat), "threads": torch.get_num_threads(),
              "jax_tok_s": round(real_tokens / jax_med),
              "torch_tok_s": round(real_tokens / torch_med), "speedup": round(speedup, 2),
              "jax_step_s": round(jax_med, 4), "torch_step_s": round(torch_med, 4),
              "loss_rel_diff": f"{loss_rel:.1e}", "grad_norm_rel_diff": f"{gn_rel:.1e}",
              "losses_agree": int(agree), "tokens": real_tokens}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    if not agree:
        raise SystemExit("step-0 loss or gradient norm differs between JAX and PyTorch")
    return result


if __name__ == "__main__":
    main()

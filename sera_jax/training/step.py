"""The training step: pure, jitted, sharded; fp32 master weights, compute in ``model_cfg.dtype``; CISPO; optax.

``train_step(state, batch) -> (state, metrics)`` takes one optimizer step's micro-batches stacked on a leading
axis ([M, B, T]) and accumulates their gradients in fp32 under ``lax.scan``; each micro-batch's loss is already
normalised by the step's global loss-token count (``rl.losses``), so the sum over micro-batches is the step loss
whatever the split. Micro-batches without a single loss token (padding up to a bucketed M) cost no compute: a
``lax.cond`` returns zeros for them. A non-finite loss or gradient norm skips the update: parameters, optimizer
state and the step counter come back unchanged, and ``metrics["skipped"]`` is 1.

``publish(params, ...)`` (``sampling.publish``) casts the master weights to the sampler's dtype and places them in
the sampler's layout, on device (no host round trip).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from typing import Any, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sera_jax.model import Qwen3Config, param_logical_axes, token_logprobs
from sera_jax.model.sharding import param_shardings
from sera_jax.parallel.mesh import activate
from sera_jax.parallel.rules import TRAIN_RULES, Rules, mesh_spec
from sera_jax.rl.batch import MicroBatch
from sera_jax.rl.losses import StepConfig, get_loss, importance_ratio
from sera_jax.rl.shapes import next_power_of_two
from sera_jax.sampling import compile_watch
from sera_jax.sampling.publish import publish  # noqa: F401 - the trainer's publish (docs/design/house.md)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # applied optimizer updates (skipped steps do not count)
    params: Any
    opt_state: Any


def init_train_state(params, tx: optax.GradientTransformation) -> TrainState:
    """Returns step 0 with the optimizer state of ``params`` (moments in the parameters' dtype)."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def stack_micro_batches(micro: list[MicroBatch], *, num: int | None = None, row_multiple: int = 1) -> MicroBatch:
    """Returns the micro-batches stacked to [M, B, T] as host arrays, M padded to ``num`` (default the next power of
    two) with loss-free micro-batches, and rows padded to a multiple of ``row_multiple`` (the mesh's batch-axis
    size)."""
    if not micro:
        raise ValueError("no micro-batches to stack")
    m = num if num is not None else next_power_of_two(len(micro))
    if m < len(micro):
        raise ValueError(f"{len(micro)} micro-batches do not fit num={m}")
    arrays = {f.name: np.stack([np.asarray(getattr(b, f.name)) for b in micro])
              for f in dataclasses.fields(MicroBatch)}
    for name, a in arrays.items():
        if name == "num_tokens":
            arrays[name] = np.concatenate([a, np.repeat(a[:1], m - len(micro), axis=0)])
            continue
        pad_m = m - a.shape[0]
        pad_b = (-a.shape[1]) % row_multiple
        arrays[name] = np.pad(a, ((0, pad_m), (0, pad_b), (0, 0)))
    return MicroBatch(**arrays)  # host arrays: ``CompiledStep.place`` (or the jitted call) moves them once


def _micro_grads(params, mb: MicroBatch, model_cfg: Qwen3Config, step_cfg: StepConfig):
    loss_fn = get_loss(step_cfg.loss)

    def objective(p):
        # Only the loss tokens' log-probabilities are needed: the head skips chunks of prompt and padding.
        logp = token_logprobs(p, model_cfg, mb.tokens, mb.targets, mb.segment_ids, mb.positions,
                              mask_BT=mb.loss_mask)
        kw = {"ratio_min": step_cfg.ratio_min, "ratio_max": step_cfg.ratio_max} if step_cfg.loss == "cispo" else {}
        adv = mb.advantages if step_cfg.advantage_sign == 1.0 else -mb.advantages
        loss = loss_fn(logp, mb.old_logprobs, adv, mb.loss_mask, num_tokens=mb.num_tokens, **kw)
        return loss, logp

    (loss, logp), grads = jax.value_and_grad(objective, has_aux=True)(params)
    mask = mb.loss_mask > 0
    ratio = importance_ratio(logp, mb.old_logprobs, mask)
    clipped = mask & ((ratio > step_cfg.ratio_max) | (ratio < step_cfg.ratio_min))
    stats = {
        "clipped_tokens": jnp.sum(clipped).astype(jnp.float32),
        "ratio_sum": jnp.sum(jnp.where(mask, ratio, 0.0)),
        "logp_sum": jnp.sum(jnp.where(mask, logp, 0.0)),
        "adv_sum": jnp.sum(jnp.where(mask, mb.advantages, 0.0)),
        "tokens": jnp.sum(mask).astype(jnp.float32),
    }
    return loss, grads, stats


def shard_like_params(tree, model_cfg: Qwen3Config):
    """Returns ``tree`` (shaped like the parameters: gradients) constrained to the parameters' layout under the
    ambient logical rules (``parallel.mesh.activate``); unchanged where no rules are in force.

    Why: left unconstrained, XLA's partitioner sums each micro-batch's gradient over every device with a full-size
    all-reduce and only then slices out the FSDP shard. Constrained, each gradient is reduce-scattered within the
    FSDP group and only its shard is summed across the data axis (hosts) — FSDP's minimum traffic — and no device
    holds a full-size gradient buffer.
    """
    if not nn.get_logical_axis_rules():
        return tree
    return jax.tree.map(nn.with_logical_constraint, tree, _param_logical_axes(model_cfg),
                        is_leaf=lambda x: isinstance(x, jax.Array))


@functools.lru_cache(maxsize=8)
def _param_logical_axes(model_cfg: Qwen3Config):
    return param_logical_axes(model_cfg)


def train_step(state: TrainState, batch: MicroBatch, *, model_cfg: Qwen3Config, tx: optax.GradientTransformation,
               step_cfg: StepConfig = StepConfig()) -> tuple[TrainState, dict[str, jax.Array]]:
    """Returns (new state, metrics) after one optimizer step over the stacked micro-batches ``batch`` [M, B, T]."""
    zeros_g = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    zero_stats = {k: jnp.zeros((), jnp.float32)
                  for k in ("clipped_tokens", "ratio_sum", "logp_sum", "adv_sum", "tokens")}

    def body(carry, mb):
        g_acc, loss_acc, stats_acc = carry

        def compute(_):
            loss, g, stats = _micro_grads(state.params, mb, model_cfg, step_cfg)
            g = shard_like_params(jax.tree.map(lambda x: x.astype(jnp.float32), g), model_cfg)
            return loss.astype(jnp.float32), g, stats

        def skip(_):
            return jnp.zeros((), jnp.float32), zeros_g, zero_stats

        loss, g, stats = jax.lax.cond(jnp.any(mb.loss_mask > 0), compute, skip, None)
        g_acc = jax.tree.map(jnp.add, g_acc, g)
        stats_acc = {k: stats_acc[k] + stats[k] for k in stats_acc}
        return (g_acc, loss_acc + loss, stats_acc), None

    (grads, loss, stats), _ = jax.lax.scan(body, (zeros_g, jnp.zeros((), jnp.float32), zero_stats), batch)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # Non-finite gradients must not reach the optimizer state even on the discarded branch's arithmetic.
    safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
    updates, new_opt = tx.update(safe_grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_state = TrainState(step=state.step + finite.astype(jnp.int32), params=pick(new_params, state.params),
                           opt_state=pick(new_opt, state.opt_state))
    tokens = jnp.maximum(stats["tokens"], 1.0)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "skipped": 1.0 - finite.astype(jnp.float32),
        "tokens": stats["tokens"],
        "clip_frac": stats["clipped_tokens"] / tokens,
        "mean_ratio": stats["ratio_sum"] / tokens,
        "mean_logp": stats["logp_sum"] / tokens,
        "mean_advantage": stats["adv_sum"] / tokens,
        "update_norm": optax.tree.norm(jax.tree.map(lambda a, b: a - b, new_state.params, state.params)),
    }
    return new_state, metrics


def batch_sharding(mesh: Mesh, rules: Rules = TRAIN_RULES) -> NamedSharding:
    """Returns the sharding of stacked micro-batches [M, B, T]: rows over the rules' ``batch`` axes."""
    return NamedSharding(mesh, PartitionSpec(None, *mesh_spec(("batch", "length"), rules)))


def batch_axis_size(mesh: Mesh, rules: Rules = TRAIN_RULES) -> int:
    """Returns how many ways the rows of a micro-batch are split (rows must be a multiple of it)."""
    axes = mesh_spec(("batch",), rules)[0]
    axes = (axes,) if isinstance(axes, str) else (axes or ())
    return int(np.prod([mesh.shape[a] for a in axes])) if axes else 1


def train_state_shardings(state_shape: TrainState, model_cfg: Qwen3Config, mesh: Mesh,
                          rules: Rules = TRAIN_RULES) -> TrainState:
    """Returns the ``NamedSharding`` of every leaf of a train state (``state_shape``: arrays or their shapes): the
    parameters as the rules place them, each Adam moment exactly like its parameter, scalars replicated."""
    p_shard = param_shardings(model_cfg, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    flat_params = jax.tree_util.tree_flatten_with_path(p_shard)[0]

    def opt_leaf_sharding(path, leaf):
        # optax moments hold a copy of the parameter tree: a leaf whose path ends with a parameter's path and
        # has its shape is that parameter's moment.
        key = jax.tree_util.keystr(path)
        for p_path, sh in flat_params:
            if key.endswith(jax.tree_util.keystr(p_path)) and leaf.ndim > 0:
                return sh
        return replicated

    opt_sh = jax.tree_util.tree_map_with_path(opt_leaf_sharding, state_shape.opt_state)
    return TrainState(step=replicated, params=p_shard, opt_state=opt_sh)


def shard_train_state(params, tx: optax.GradientTransformation, model_cfg: Qwen3Config, mesh: Mesh,
                      rules: Rules = TRAIN_RULES) -> TrainState:
    """Returns a TrainState with params placed by the rules and Adam moments sharded exactly like their
    parameters (the optimizer state is created on device, under jit, from the sharded parameters)."""
    p_shard = param_shardings(model_cfg, mesh, rules)
    params = jax.device_put(params, p_shard)
    shape = jax.eval_shape(lambda p: init_train_state(p, tx), params)
    sh = train_state_shardings(shape, model_cfg, mesh, rules)
    opt_state = jax.jit(tx.init, out_shardings=sh.opt_state)(params)
    return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), sh.step), params=params, opt_state=opt_state)


def batch_shardings(mesh: Mesh, rules: Rules = TRAIN_RULES) -> MicroBatch:
    """Returns the sharding of each field of stacked micro-batches: rows over the ``batch`` axes, the token count
    replicated."""
    b_sh = batch_sharding(mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    return MicroBatch(**{f.name: (replicated if f.name == "num_tokens" else b_sh)
                         for f in dataclasses.fields(MicroBatch)})


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """A jitted train step and the layouts it expects: call it as ``step(state, batch) -> (state, metrics)``.

    ``batch_sharding`` is where a host batch must be put before the call (None: wherever it is, single device);
    ``state_shardings`` the layout the state keeps across steps (the state is donated). ``warm(state, shapes)``
    compiles the step ahead of time for batch shapes [M, B, T] (nothing runs); a call whose batch has one of them
    uses that executable, so it neither traces nor compiles.
    """

    jitted: Any
    mesh: Mesh | None = None
    rules: Rules = TRAIN_RULES
    state_shardings: Any = None
    batch_sharding: MicroBatch | None = None
    executables: dict = dataclasses.field(default_factory=dict, compare=False)
    _background: list = dataclasses.field(default_factory=list, compare=False, repr=False)
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False, repr=False)

    def __call__(self, state: TrainState, batch: MicroBatch) -> tuple[TrainState, dict[str, jax.Array]]:
        self.wait_warm()
        exe = self.executables.get(tuple(batch.tokens.shape))
        ctx = activate(self.mesh, self.rules) if self.mesh is not None else contextlib.nullcontext()
        with ctx:
            return exe(state, batch) if exe is not None else self.jitted(state, batch)

    def place(self, batch: MicroBatch, *, local: bool = False) -> MicroBatch:
        """Returns ``batch`` on the devices, in the layout the step expects.

        ``local``: ``batch`` holds only this process's rows (a multi-host step: each process packs its own datums);
        the global batch is the processes' rows side by side, each process filling only its own devices (the token
        count, replicated, is the same everywhere)."""
        if self.batch_sharding is None:
            return batch
        if not local:
            return jax.device_put(batch, self.batch_sharding)
        return jax.tree.map(lambda x, sh: jax.make_array_from_process_local_data(sh, np.asarray(x)),
                            batch, self.batch_sharding)

    def warm_in_background(self, state: TrainState, shapes: Sequence[tuple[int, int, int]]) -> None:
        """Starts ``warm`` for ``shapes`` in a thread (its compiles counted as ahead of time, see
        ``compile_watch.ahead_of_time``): the first rollout generates meanwhile, and the first call waits for it."""
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                with compile_watch.ahead_of_time():
                    result["executables"] = self.warm(abstract, shapes)
            except BaseException as e:  # noqa: BLE001 - raised again in the thread that waits
                result["error"] = e

        thread = threading.Thread(target=run, name="sera-step-warmup", daemon=True)
        thread.start()
        self._background.append((thread, result))

    def wait_warm(self) -> float:
        """Waits for a background warm-up; returns the seconds waited (its error, if any, is raised here)."""
        t0 = time.monotonic()
        while self._background:
            thread, result = self._background.pop(0)
            thread.join()
            if "error" in result:
                raise RuntimeError("the train step's background warm-up failed") from result["error"]
        return time.monotonic() - t0

    def stop_warm(self) -> float:
        """Stops a background warm-up after the compile in progress (XLA cannot cancel one) and waits for it;
        returns the seconds waited. Called on every way out of a run: a thread still compiling when the
        interpreter exits aborts it (``terminate called after throwing…``, exit 134)."""
        self._stop.set()
        t0 = time.monotonic()
        while self._background:
            thread, _ = self._background.pop(0)
            thread.join()  # its error, if any, no longer matters: nothing will run the step
        return time.monotonic() - t0

    def warm(self, state: TrainState, shapes: Sequence[tuple[int, int, int]]) -> int:
        """Compiles the step for each [M, B, T] of ``shapes`` not compiled yet (abstract batches: nothing runs);
        returns how many it compiled."""
        new = 0
        for shape in shapes:
            if self._stop.is_set():
                break  # the run is ending (stop_warm)
            if tuple(shape) in self.executables:
                continue
            batch = abstract_micro_batch(shape, self.batch_sharding)
            ctx = activate(self.mesh, self.rules) if self.mesh is not None else contextlib.nullcontext()
            with ctx:
                self.executables[tuple(shape)] = self.jitted.lower(state, batch).compile()
            # Placing a host batch of this shape runs small programs of its own (splitting rows over devices). A
            # multi-host placement runs none (each process puts its own rows), and would not be this thread's to do.
            if self.batch_sharding is None or self.batch_sharding.tokens.is_fully_addressable:
                zeros = {f.name: np.zeros(getattr(batch, f.name).shape, getattr(batch, f.name).dtype)
                         for f in dataclasses.fields(MicroBatch)}
                jax.block_until_ready(self.place(MicroBatch(**zeros)))
            new += 1
        return new


def abstract_micro_batch(shape: tuple[int, int, int], shardings: MicroBatch | None = None) -> MicroBatch:
    """Returns stacked micro-batches of ``shape`` [M, B, T] as ``ShapeDtypeStruct``s (in ``shardings``' layout)."""
    m = shape[0]
    fields = {}
    for f in dataclasses.fields(MicroBatch):
        sh = getattr(shardings, f.name) if shardings is not None else None
        if f.name == "num_tokens":
            fields[f.name] = jax.ShapeDtypeStruct((m,), jnp.int32, sharding=sh)
        else:
            dt = jnp.int32 if f.name in ("tokens", "targets", "positions", "segment_ids") else jnp.float32
            fields[f.name] = jax.ShapeDtypeStruct(tuple(shape), dt, sharding=sh)
    return MicroBatch(**fields)


def make_train_step(model_cfg: Qwen3Config, tx: optax.GradientTransformation, step_cfg: StepConfig = StepConfig(),
                    *, mesh: Mesh | None = None, rules: Rules = TRAIN_RULES,
                    state: TrainState | None = None) -> CompiledStep:
    """Returns the jitted ``train_step(state, batch) -> (state, metrics)`` as a ``CompiledStep``; with a mesh,
    FSDP/data sharded (state shardings read from ``state``, e.g. from ``shard_train_state``, or its abstract
    ``ShapeDtypeStruct``s with shardings, to lower for a deviceless target) with the state donated (its buffers are
    reused for the new state)."""
    fn = functools.partial(train_step, model_cfg=model_cfg, tx=tx, step_cfg=step_cfg)
    if mesh is None:
        return CompiledStep(jax.jit(fn, donate_argnums=0))
    if state is None:
        raise ValueError("make_train_step with a mesh needs the (sharded) state whose layout it keeps")
    st_sh = jax.tree.map(lambda x: x.sharding, state)
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_sh = batch_shardings(mesh, rules)
    jitted = jax.jit(fn, in_shardings=(st_sh, batch_sh), out_shardings=(st_sh, replicated), donate_argnums=0)
    return CompiledStep(jitted, mesh=mesh, rules=rules, state_shardings=st_sh, batch_sharding=batch_sh)

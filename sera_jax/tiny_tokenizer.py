"""The tiny default's tokenizer: a small sentencepiece model trained on the text a TextCraft agent sees and writes.

The corpus is what the policy meets in training: the system prompt and the first user message of many training
tasks, and gold-plan code cells rendered as assistant turns (with ``launch_subagent`` and ``finish`` calls), so the
tiny policy's vocabulary covers prompts, item names and tool calls in few tokens. Built deterministically (fixed
corpus order, single-threaded trainer) and cached at the given path.
"""

from __future__ import annotations

from pathlib import Path

from sera_jax.model.tokenizer import load_tokenizer, train_sentencepiece

BUILTIN_PREFIX = "builtin:"


def _corpus(max_tasks: int = 300) -> list[str]:
    from envs_py.textcraft import load_tasks
    from sera_jax.agents import codeact_prompt as P

    texts = [P.system_prompt()]
    for task in load_tasks("train")[:max_tasks]:
        texts.append(P.task_message(task.goal))
        plan = task.payload.get("gold_trajectory") or []
        cells = []
        for step in plan:
            ingredients = step.get("ingredients") if isinstance(step, dict) else None
            target = step.get("target") if isinstance(step, dict) else None
            if ingredients and target:
                cells.append(f"print(craft({dict(ingredients)!r}, {tuple(target)!r}))")
        targets = task.payload.get("target_items") or {}
        cells.append(f"r = await launch_subagent({dict(targets)!r}, 'use the inventory')\nprint(r)")
        cells.append("print(view_inventory())\nprint(get_info(['" + "', '".join(targets) + "']))")
        cells.append("finish('crafted the targets')")
        texts.extend(P.assistant_message("craft step by step", c) for c in cells)
    return texts


def build_tiny_tokenizer(path: str | Path, vocab_size: int = 512) -> Path:
    """Trains (once) the tiny TextCraft sentencepiece model at ``path``; returns the path of the ``.model``."""
    path = Path(path)
    if path.suffix != ".model":
        path = path / "tokenizer.model"
    if not path.is_file():
        train_sentencepiece(_corpus(), path, vocab_size, num_threads=1, input_sentence_size=0,
                            max_sentence_length=1 << 16)
    return path


def resolve_tokenizer(spec: str | None, hf_dir: str | None, run_dir: str | Path):
    """Returns (tokenizer, path) for a config's ``model.tokenizer`` (see ``config.ModelSection``)."""
    if spec is None:
        if hf_dir is None:
            raise ValueError("model.tokenizer: no tokenizer given and no model.hf_dir to take it from")
        spec = hf_dir
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name != "textcraft":
            raise ValueError(f"model.tokenizer: unknown builtin tokenizer {name!r} (known: builtin:textcraft)")
        spec = str(build_tiny_tokenizer(Path(run_dir) / "tokenizer.model"))
    return load_tokenizer(spec), spec
